"""Sharded evaluation, for any model: each validation sample is scored once, on exactly one
rank, and the metrics are summed over the ranks (:class:`~.metrics.MetricBook`), so every
rank reports the whole split's figures."""
from __future__ import annotations

from typing import Callable, Optional

from ...store.dist import DistContext
from .epoch import BatchHooks
from .metrics import MetricBook


def evaluate(context, processor, loader, dist: DistContext, book: MetricBook,
             hooks: BatchHooks = BatchHooks(), batch_axis: int = 0,
             on_batch: Optional[Callable[[int], None]] = None) -> int:
    """Score every batch of this rank's shard of the validation split with the batch
    processor's ``evaluate_batch`` (`context` is what it is given as the estimator); the
    batch handlers (`hooks`: the metric updates among them) run around every batch, one
    that holds no usable sample included (given as None, with ``out`` None). Then `book`'s
    metrics are summed over the ranks (under ``dist_async``, where each rank scores the
    whole split, this rank's own). Returns how many samples were scored over all ranks.
    `on_batch` is called with the batch number after each batch (the stall watchdog)."""
    count = 0
    for number, batch in enumerate(loader, 1):
        used = processor.batch_samples(batch, batch_axis)
        # None when every sample of the batch was unusable: the handlers still see the
        # position, so that what counts batches counts every one.
        hooks.batch_begin(batch if used else None)
        out = processor.evaluate_batch(context, batch, batch_axis) if used else None
        hooks.batch_end(batch if used else None, out)
        count += used
        if on_batch is not None:
            on_batch(number)
    (count,) = book.reduce(dist, [count])
    return int(count)
