"""Sharded evaluation: each test sample is scored once, on exactly one rank."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import mxnet as mx
from mxnet import gluon

from .batches import split_batch
from ..store.dist import DistContext


@dataclass(frozen=True)
class EvalResult:
    """Totals over all ranks: every rank holds the same numbers."""

    correct: float
    count: float
    loss_sum: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else 0.0


def score_batch(net, loss_fn, images, labels, devices, dtype="float32"):
    """Forward one numpy batch over `devices`; returns (correct, loss sum) NDArrays on the
    first device, still lazy, so the caller decides when to wait for them."""
    xs, ys, _ = split_batch(images, labels, devices, dtype)
    outs = [net(x) for x in xs]
    return tally_batch(outs, ys, [loss_fn(o, y) for o, y in zip(outs, ys)], devices[0])


def tally_batch(outs, ys, losses, device):
    correct = mx.nd.add_n(*[(o.argmax(axis=1) == y).sum().astype("float32").as_in_context(device)
                            for o, y in zip(outs, ys)])
    loss_sum = mx.nd.add_n(*[l.sum().astype("float32").as_in_context(device) for l in losses])
    return correct, loss_sum


def evaluate(net, loader, devices, dist: DistContext, dtype: str = "float32",
             on_batch: Optional[Callable[[int], None]] = None) -> EvalResult:
    """Score every batch of this rank's shard of the test set, then sum
    (correct, count, loss) over all ranks with the store (under ``dist_async``, where the
    loader covers the whole test set, this rank's own figures).

    `on_batch` is called with the batch number after each batch (the stall watchdog)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    totals = mx.nd.zeros(3, ctx=devices[0])
    for batch, (images, labels) in enumerate(loader, 1):
        correct, loss_sum = score_batch(net, loss_fn, images, labels, devices, dtype)
        totals += mx.nd.concat(correct, mx.nd.array([len(labels)], ctx=devices[0]),
                               loss_sum, dim=0)
        if on_batch is not None:
            on_batch(batch)
    if dist.synchronous:
        totals = dist.sum_across_workers("eval_totals", totals.as_in_context(mx.cpu()))
    correct, count, loss_sum = (float(v) for v in totals.asnumpy())
    return EvalResult(correct, count, loss_sum)
