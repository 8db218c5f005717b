"""How many samples each step really used, over all ranks, and the limit on unusable ones.

A streamed loader leaves an unreadable or undecodable sample out of its batch, so two ranks
can hold batches of different sizes at the same step. The stores *sum* gradients, and the
update divides that sum by the ``batch_size`` given to ``trainer.step``: that number must be
the samples that contributed on every rank together, the same on every rank, or the replicas
apply different updates to the same sum and drift apart. :class:`StepCounts` sums
(used, skipped) over the workers once per step: one exact allreduce of two numbers, issued
before the step's last forward pass so that it completes under the compute, and read when
the update needs it. Loaders that never leave a sample out (the in-memory datasets) need no
such exchange: every rank's batch has the same size.
"""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Tuple

import mxnet as mx

from ..data.datasets import DatasetError
from ..store.dist import DistContext

logger = logging.getLogger("hvdtrain")

EXAMPLES = 3  # unusable samples named in the error that ends a job


def allowed_bad(limit: str, total: int) -> int:
    """How many of `total` samples may be unusable under `limit` (``"10"``: ten; ``"1%"``:
    one percent of `total`, rounded down)."""
    if limit.endswith("%"):
        return math.floor(float(limit[:-1]) / 100 * total + 1e-9)
    return int(limit)


def check_bad_samples(what: str, skipped: int, total: int, limit: str, examples: List[str],
                      epoch: int, used: Optional[int] = None) -> None:
    """Raise :class:`DatasetError` when `skipped` samples of a split of `total` are more
    than `limit` allows, or (`used` given: at the end of a pass) when none was usable.

    Every rank must call it with the same global counts, so that all of them stop at the
    same point. `examples` are this rank's own unusable samples, each as "path: why"."""
    allowed = allowed_bad(limit, total)
    if skipped <= allowed and (used is None or used or not skipped):
        return
    if skipped <= allowed:
        reason = f"none of its samples could be used ({skipped} unusable)"
    else:
        reason = (f"{skipped} of its {total} samples could not be read or decoded, more than "
                  f"--max-bad-samples {limit} allows ({allowed})")
    named = "; ".join(examples[:EXAMPLES]) if examples else "none met on this rank"
    raise DatasetError(f"epoch {epoch + 1}: the {what} split is not usable: {reason}. "
                       f"First on this rank: {named}. Fix or remove those files, or raise "
                       f"--max-bad-samples")


class StepCounts:
    """The global count of samples behind each optimizer step, and of those left out.

    Parameters
    ----------
    dist : DistContext
    exchange : bool
        Sum the counts over the workers (a loader that can leave samples out, under a
        synchronous store with more than one worker); else every rank's count is taken to
        be the same and multiplied by the number of workers.

    With a count of 0 (every sample of the step, on every rank, was unusable) the caller
    takes no update: there is nothing to average.
    """

    def __init__(self, dist: DistContext, exchange: bool):
        self.dist = dist
        self.exchange = exchange
        self._pending: Optional[mx.nd.NDArray] = None
        self._local = (0, 0)

    def submit(self, used: int, skipped: int) -> None:
        """This rank's samples used and left out in the step about to finish; the sum
        over the workers starts now, in the background, when it must be exchanged."""
        self._local = (used, skipped)
        if self.exchange:
            counts = mx.nd.array([used, skipped])  # float32: exact to 2**24 a step
            self._pending = self.dist.sum_across_workers("step_samples", counts)

    def result(self) -> Tuple[int, int]:
        """(used, skipped) of the step over all workers; waits for the sum if needed."""
        if self._pending is not None:
            used, skipped = (int(round(v)) for v in self._pending.asnumpy())
            self._pending = None
            return used, skipped
        # Not exchanged: every rank's batch has this size (an in-memory loader never leaves
        # a sample out), or there is one worker; a skip count is then this rank's own.
        used, skipped = self._local
        return used * self.dist.num_workers, skipped


def count_skipped(train_loader, test_loader, dist: DistContext, epoch: int) -> dict:
    """Samples the loaders left out this epoch (unreadable or undecodable), over all ranks,
    as the metrics record's fields; rank 0 warns once with the totals (each rank has already
    named its own bad samples, one warning each). In-memory loaders leave none out."""
    if not hasattr(train_loader, "skipped"):
        return dict(skipped_train_samples=0, skipped_val_samples=0)
    mine = [len(loader.skipped) for loader in (train_loader, test_loader)]
    if dist.synchronous:
        mine = dist.sum_across_workers("skipped_samples", mx.nd.array(mine)).asnumpy()
    train, val = (int(n) for n in mine)
    # Without a synchronous store the counts are this rank's own: then each rank says its own.
    if (train or val) and (dist.rank == 0 or not dist.synchronous):
        logger.warning("epoch %d: %d training and %d validation sample(s) could not be read "
                       "or decoded and were left out (named in the warnings above, by the "
                       "rank that met them)", epoch + 1, train, val)
    return dict(skipped_train_samples=train, skipped_val_samples=val)
