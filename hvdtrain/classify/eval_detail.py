"""Evaluation in detail, for ``--eval-only``: top-1 and top-5, the confusion matrix and the
worst-classified samples, over all ranks.

Each rank scores its shard of the validation split (every sample on exactly one rank, as
:func:`~hvdtrain.loop.engine.evaluate.evaluate` does), then the ranks sum what they found: the
confusion matrix, the top-5 hits and loss, and a table in which each rank fills its own rows
with its `worst` highest-loss samples, so that every rank holds the same report. Training's
per-epoch evaluation stays the cheap one: this one reads every batch's scores on the host.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import mxnet as mx
import numpy as np

from ..loop.engine.batches import split_batch
from ..store.dist import DistContext

WORST = 20  # samples listed as the worst classified


@dataclass(frozen=True)
class WorstSample:
    """One of the samples scored worst: the lowest probability for its true class."""

    position: int  # the sample's index in the split
    label: int
    predicted: int
    probability: float  # the model's probability for the true class
    loss: float  # -log(probability)


@dataclass
class EvalReport:
    """What an evaluation found, over all ranks (every rank holds the same)."""

    confusion: np.ndarray  # [true class, predicted class] -> samples
    top5_correct: int
    loss_sum: float
    worst: List[WorstSample] = field(default_factory=list)

    @property
    def count(self) -> int:
        return int(self.confusion.sum())

    @property
    def correct(self) -> int:
        return int(np.trace(self.confusion))

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else 0.0

    @property
    def top5(self) -> float:
        return self.top5_correct / self.count if self.count else 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else 0.0

    def per_class(self) -> List[Tuple[int, int, float]]:
        """(samples, correct, accuracy) of each true class (accuracy 0 for an empty one)."""
        totals = self.confusion.sum(axis=1)
        hits = np.diag(self.confusion)
        return [(int(t), int(h), float(h / t) if t else 0.0) for t, h in zip(totals, hits)]


def _scores(net, images, labels, devices, dtype) -> Tuple[np.ndarray, np.ndarray]:
    """Float32 log-probabilities of one batch on the host, and its labels."""
    xs, ys, _ = split_batch(images, labels, devices, dtype)
    logs = [mx.nd.log_softmax(net(x).astype("float32"), axis=1).as_in_context(mx.cpu())
            for x in xs]
    return mx.nd.concat(*logs, dim=0).asnumpy(), labels.astype(np.int64)


def evaluate_detailed(net, loader, devices, dist: DistContext, num_classes: int,
                      dtype: str = "float32", worst: int = WORST, on_batch=None) -> EvalReport:
    """Score this rank's shard (`loader` must offer ``batches()``: images, labels and the
    samples' positions) and sum the report over all ranks."""
    confusion = np.zeros((num_classes, num_classes), np.float64)
    top5, loss_sum = 0, 0.0
    candidates = []  # (loss, position, label, predicted, probability)
    k = min(5, num_classes)
    for batch, (images, labels, positions) in enumerate(loader.batches(), 1):
        if len(labels):  # empty when every sample of the batch was unusable
            log_probs, labels = _scores(net, images, labels, devices, dtype)
            predicted = log_probs.argmax(axis=1)
            np.add.at(confusion, (labels, predicted), 1)
            # The top k by score; ties broken as argpartition does (a true class tied at
            # the k-th score may or may not count, as with mx.nd.topk).
            best = np.argpartition(-log_probs, k - 1, axis=1)[:, :k]
            top5 += int((best == labels[:, None]).any(axis=1).sum())
            losses = -log_probs[np.arange(len(labels)), labels]
            loss_sum += float(losses.sum())
            for i in np.argsort(-losses)[:worst]:
                candidates.append((float(losses[i]), int(positions[i]), int(labels[i]),
                                   int(predicted[i]), float(np.exp(-losses[i]))))
            candidates = sorted(candidates, key=lambda c: (-c[0], c[1]))[:worst]
        if on_batch is not None:
            on_batch(batch)
    # One table for all: this rank's rows hold its own worst; the others stay zero.
    table = np.zeros((dist.num_workers, worst, 6), np.float64)
    for row, (loss, position, label, pred, prob) in enumerate(candidates):
        table[dist.rank, row] = (1, loss, position, label, pred, prob)
    sums = np.concatenate([confusion.ravel(), [top5, loss_sum], table.ravel()])
    if dist.synchronous and dist.num_workers > 1:
        sums = dist.sum_across_workers("eval_report", mx.nd.array(sums, dtype="float64")) \
            .asnumpy()
    confusion = np.rint(sums[:num_classes ** 2]).reshape(num_classes, num_classes)
    top5, loss_sum = int(round(sums[num_classes ** 2])), float(sums[num_classes ** 2 + 1])
    rows = sums[num_classes ** 2 + 2:].reshape(-1, 6)
    rows = sorted((r for r in rows if r[0] > 0), key=lambda r: (-r[1], r[2]))[:worst]
    return EvalReport(confusion.astype(np.int64), top5, loss_sum,
                      [WorstSample(int(round(r[2])), int(round(r[3])), int(round(r[4])),
                                     float(r[5]), float(r[1])) for r in rows])
