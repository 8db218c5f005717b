"""Sharded evaluation: each test sample is scored once, on exactly one rank."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import mxnet as mx
from mxnet import gluon

from .batches import split_batch
from ...store.dist import DistContext


@dataclass(frozen=True)
class EvalResult:
    """Totals over all ranks: every rank holds the same numbers."""

    correct: float
    count: float
    loss_sum: float
    correct_top5: float = 0.0

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else 0.0

    @property
    def top5(self) -> float:
        """Share of samples whose label is among the 5 highest scores (all of them when
        there are at most 5 classes)."""
        return self.correct_top5 / self.count if self.count else 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else 0.0


def score_batch(net, loss_fn, images, labels, devices, dtype="float32"):
    """Forward one numpy batch over `devices`; returns (correct, loss sum, top-5 correct)
    NDArrays on the first device, still lazy, so the caller decides when to wait for them."""
    xs, ys, _ = split_batch(images, labels, devices, dtype)
    outs = [net(x) for x in xs]
    correct, loss_sum = tally_batch(outs, ys, [loss_fn(o, y) for o, y in zip(outs, ys)],
                                    devices[0])
    return correct, loss_sum, top5_correct(outs, ys, devices[0])


def top5_correct(outs, ys, device):
    """How many labels are among their output's 5 highest scores."""
    hits = []
    for out, label in zip(outs, ys):
        top = mx.nd.topk(out, k=min(5, out.shape[1]), axis=1)
        hits.append((top == label.reshape((-1, 1)).astype(top.dtype)).sum()
                    .astype("float32").as_in_context(device))
    return mx.nd.add_n(*hits)


def predicted_classes(out):
    """The class each row of `out` scores highest, as float32: a float16 argmax would
    round class indices above 2048 (2049 becomes 2048)."""
    return out.astype("float32", copy=False).argmax(axis=1)


def tally_batch(outs, ys, losses, device):
    correct = mx.nd.add_n(*[(predicted_classes(o) == y).sum().astype("float32")
                            .as_in_context(device) for o, y in zip(outs, ys)])
    loss_sum = mx.nd.add_n(*[l.sum().astype("float32").as_in_context(device) for l in losses])
    return correct, loss_sum


def evaluate(net, loader, devices, dist: DistContext, dtype: str = "float32",
             on_batch: Optional[Callable[[int], None]] = None) -> EvalResult:
    """Score every batch of this rank's shard of the test set, then sum
    (correct, count, loss) over all ranks with the store (under ``dist_async``, where the
    loader covers the whole test set, this rank's own figures).

    `on_batch` is called with the batch number after each batch (the stall watchdog)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    totals = mx.nd.zeros(4, ctx=devices[0])
    for batch, (images, labels) in enumerate(loader, 1):
        if len(labels):  # empty when every sample of the batch was unusable
            correct, loss_sum, top5 = score_batch(net, loss_fn, images, labels, devices, dtype)
            totals += mx.nd.concat(correct, mx.nd.array([len(labels)], ctx=devices[0]),
                                   loss_sum, top5, dim=0)
        if on_batch is not None:
            on_batch(batch)
    if dist.synchronous:
        totals = dist.sum_across_workers("eval_totals", totals.as_in_context(mx.cpu()))
    correct, count, loss_sum, top5 = (float(v) for v in totals.asnumpy())
    return EvalResult(correct, count, loss_sum, top5)
