"""How many samples each step really used, over all ranks, and the limit on unusable ones.

A streamed loader leaves an unreadable or undecodable sample out of its batch, so two ranks
can hold batches of different sizes at the same step. The stores *sum* gradients, and the
update divides that sum by the ``batch_size`` given to ``trainer.step``: that number must be
the samples that contributed on every rank together, the same on every rank, or the replicas
apply different updates to the same sum and drift apart. :class:`StepCounts` sums
(used, skipped) over the workers once per step: one exact allreduce of two numbers, issued
before the step's last forward pass so that it completes under the compute, and read when
the update needs it. The same exchange carries every rank's vote on whether to save or stop
at this step (hvdtrain/loop/run/boundary.py), so it runs in every synchronous run of more than one
worker that votes (all but ``--elastic``), in-memory datasets included (whose batches have the
same size on every rank): its cost is in docs/performance.md ("The step's own allreduce").
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import mxnet as mx

from ...data.datasets import DatasetError
from ...store.dist import DistContext

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
        advice = "Fix or replace those files: no limit lets a run train on nothing"
    else:
        reason = (f"{skipped} of its {total} samples could not be read or decoded, more than "
                  f"--max-bad-samples {limit} allows ({allowed})")
        advice = "Fix or remove those files, or raise --max-bad-samples"
    named = ("First on this rank: " + "; ".join(examples[:EXAMPLES])) if examples else \
        "This rank met none of them: the ranks that did name theirs"
    raise DatasetError(f"epoch {epoch + 1}: the {what} split is not usable: {reason}. "
                       f"{named}. {advice}")


class StepCounts:
    """The global count of samples behind each optimizer step, of those left out, and the
    sum of every rank's vote.

    Parameters
    ----------
    dist : DistContext
    exchange : bool
        Sum the counts and votes over the workers (a synchronous store with more than one
        worker); else every rank's sample count is taken to be the same and multiplied by
        the number of workers, and the votes are this rank's own.

    With a count of 0 (every sample of the step, on every rank, was unusable) the caller
    takes no update: there is nothing to average.
    """

    def __init__(self, dist: DistContext, exchange: bool):
        self.dist = dist
        self.exchange = exchange
        self._pending: Optional[mx.nd.NDArray] = None
        self._local: Tuple[int, int, Tuple[int, ...]] = (0, 0, ())

    def submit(self, used: int, skipped: int, votes: Sequence[int] = ()) -> None:
        """This rank's samples used and left out in the step about to finish, and its
        `votes`; the sum over the workers starts now, in the background, when exchanged."""
        self._local = (used, skipped, tuple(votes))
        if self.exchange:
            counts = mx.nd.array([used, skipped, *votes])  # float32: exact to 2**24 a step
            self._pending = self.dist.sum_across_workers("step_counts", counts)

    def result(self) -> Tuple[int, int, Tuple[int, ...]]:
        """(used, skipped, votes) of the step over all workers; waits for the sum if needed."""
        if self._pending is not None:
            summed = [int(round(v)) for v in self._pending.asnumpy()]
            self._pending = None
            return summed[0], summed[1], tuple(summed[2:])
        # Not exchanged: every rank's batch has this size (an in-memory loader never leaves
        # a sample out), or there is one worker; a skip count and votes are this rank's own.
        used, skipped, votes = self._local
        return used * self.dist.num_workers, skipped, votes
