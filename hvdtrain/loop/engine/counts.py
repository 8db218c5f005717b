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
Its last word is this rank's verdict on its step (1: its batch or pass failed,
:mod:`.step_verdict`), so a rank that fails still joins the step's exchange and every rank
learns it there.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import mxnet as mx

from ...data.datasets import DatasetError
from ...data.reshard import ShardedLoader
from ...store.buckets import BucketedTrainer
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


KEPT_VECTORS = 64  # distinct count vectors kept (a step's values: almost always the same)


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
        self._prepared: Optional[mx.nd.NDArray] = None  # submitted `later`, not yet sent
        self._local: Tuple[int, int, Tuple[int, ...]] = (0, 0, ())
        self._local_divisor: Optional[float] = None
        self._vectors: dict = {}  # (values, dtype) -> an array of them, never sent itself
        # The step's loss divisor summed over the workers, set by result() when submitted
        # with one (divisors.py): what the summed gradient is divided by besides the count.
        self.divisor: Optional[float] = None
        self.failed = 0  # ranks whose step failed (the verdict words summed), set by result()

    def submit(self, used: int, skipped: int, votes: Sequence[int] = (),
               divisor: Optional[float] = None, failed: bool = False,
               later: bool = False) -> None:
        """This rank's samples used and left out in the step about to finish, its `votes`,
        its loss `divisor` (None: per-sample losses) and whether its step `failed`; the sum
        over the workers starts now, in the background, when exchanged (`later`: at
        :meth:`send`, once the step's verdict is known)."""
        self._local, self._local_divisor = (used, skipped, tuple(votes)), divisor
        if self.exchange:
            copy = self._copy(used, skipped, votes, divisor, failed)
            if later:
                self._prepared = copy
            else:
                self._pending = self.dist.sum_across_workers("step_counts", copy)

    def send(self, failed: bool) -> None:
        """Sum the counts submitted `later`, with this rank's verdict (`failed`: its pass
        raised after they were made)."""
        copy, self._prepared = self._prepared, None
        if copy is None:
            return
        if failed:
            used, skipped, votes = self._local
            copy = self._copy(used, skipped, votes, None, True)
        self._pending = self.dist.sum_across_workers("step_counts", copy)

    def _copy(self, used, skipped, votes, divisor, failed) -> mx.nd.NDArray:
        # float64: exact to 2**53 (valid pixels pass float32's 2**24 in a batch), and sent
        # beside float32 gradients (with_gradients) never fused with them into Horovod's
        # fusion buffer, which would copy a bucket in and out. The verdict word goes last.
        values = (used, skipped, *votes, int(failed)) if divisor is None else \
            (used, skipped, divisor, *votes, int(failed))
        dtype = "float64"
        # Summed in place: a copy of the vector, made by the engine (an array made from
        # the host's values waits for the engine's queue: a host sync every step). Most
        # steps send the same values, so the vectors are kept. Made when submitted (before
        # the step's last pass, where the pass's own work would queue ahead of it).
        vector = self._vectors.get((values, dtype))
        if vector is None:
            if len(self._vectors) >= KEPT_VECTORS:
                self._vectors.clear()
            vector = self._vectors[(values, dtype)] = mx.nd.array(values, dtype=dtype)
        return vector.copy()

    def result(self) -> Tuple[int, int, Tuple[int, ...]]:
        """(used, skipped, votes) of the step over all workers, and ``divisor`` set; waits
        for the sum if needed."""
        if self._pending is not None:
            values = self._pending.asnumpy().tolist()
            self._pending = None
            self.failed = int(round(values.pop()))
            if self._local_divisor is not None:
                self.divisor = values.pop(2)
            summed = [int(round(v)) for v in values]
            return summed[0], summed[1], tuple(summed[2:])
        # Not exchanged: every rank's batch has this size (an in-memory loader never leaves
        # a sample out), or there is one worker; a skip count and votes are this rank's own.
        used, skipped, votes = self._local
        self.divisor, self.failed = self._local_divisor, 0
        return used * self.dist.num_workers, skipped, votes


class LeftOut:
    """How many samples the loader left out of each batch as unusable, from the loader's
    own record of them, never from ``batch_samples`` (which a processor may count in
    objects or tokens: a count of another unit than the positions the loader consumed).

    - A resharded Gluon loader (:class:`~hvdtrain.data.reshard.ShardedLoader`) adds why each
      sample was left out to its ``skipped`` list as it yields the batch: the list's growth
      since the batch before.
    - hvdtrain's streamed image loader decodes batches ahead in threads (its list grows
      early), and its batches are ``(images, labels)`` with one row a sample read: the
      positions the batch consumed less its rows.
    - Any other loader (in memory) leaves nothing out.
    """

    def __init__(self, loader, batch_axis: int = 0):
        self.loader, self.batch_axis = loader, batch_axis
        self._listed = isinstance(loader, ShardedLoader)
        self._rows = not self._listed and hasattr(loader, "skipped")
        self._seen = 0  # the list's length after the last batch (a new iteration empties it)

    def of(self, batch, positions: int) -> int:
        """The samples left out of `batch`, which consumed `positions` of the epoch."""
        if self._listed:
            now = len(self.loader.skipped)
            left, self._seen = now - self._seen, now
            return left
        if self._rows:
            rows = 0 if batch is None else int(batch[0].shape[self.batch_axis])
            return max(positions - rows, 0)
        return 0


def with_gradients(trainer, counts: StepCounts, divides: bool, clipper, amp: bool) -> bool:
    """Whether a step's counts can be sent right after its gradients, in the same cycle of
    Horovod's negotiation (one round a step instead of two; the update waits for both):
    for hvdtrain's bucketed exchange sent whole (no PowerSGD, sharded state, clipping or
    AMP, which read the step's divisor before or during the exchange) and counts of samples
    alone (no loss divisor)."""
    return (counts.exchange and not divides and clipper is None and not amp
            and type(trainer) is BucketedTrainer and trainer.compression is None)
