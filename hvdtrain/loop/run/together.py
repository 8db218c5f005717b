"""Every rank leaves together when one of them cannot write its outputs.

Rank 0 alone writes the metrics, checkpoints, TensorBoard scalars and final parameters. If
it left on its own when a write failed (a full disk), the other ranks would be inside their
next collective when it vanished: under Gloo they died with Horovod's "has been shut down"
traceback, under MPI the launcher killed them without a word, and Horovod 0.28.1 could
crash natively (SIGSEGV in ``EnqueueTensorBroadcast``/``EnqueueTensorAllreduces``): an
enqueue checks ``horovod_global.shut_down`` and then uses the process set that the
background thread, shutting down after the lost peer, is finalising at that moment
(``horovod/common/operations.cc``).

So the ranks meet after every batch of writes (:func:`write_together`): they sum one flag per
rank, and if any rank failed, every rank raises :class:`StoppedTogether` at that same
point, holding the one line it should print. :meth:`StoppedTogether.leave` is called once
the line is out: a last collective (so no rank exits before every rank has printed; mpirun
kills the others as soon as one exits) and the store's orderly shutdown, so no rank's
Horovod sees its peer vanish.
"""
from __future__ import annotations

import logging
from typing import Callable, List, Optional

from ...config import EXIT_PREEMPTED
from ...state.writes import OutputError
from ...store.agree import leave
from ...store.dist import DistContext

logger = logging.getLogger("hvdtrain")


class StoppedTogether(RuntimeError):
    """Some rank could not write its outputs; every rank raises this at the same point.

    Parameters
    ----------
    line : str
        The one line this rank prints: the failed write's own message on the rank that
        failed, which rank failed and where on the others.
    leave : callable
        Call after printing `line`: waits until every rank has printed its own, then shuts
        the store down in order. Never raises.
    """

    status = 1  # the exit status of every rank (cli.EXIT_FAILED)

    def __init__(self, line: str, leave: Callable[[], None]):
        super().__init__(line)
        self.line = line
        self._leave = leave

    def leave(self) -> None:
        try:
            self._leave()
        except Exception:  # pylint: disable=broad-except
            # A peer that died meanwhile: nothing left to wait for.
            logger.debug("leaving together failed", exc_info=True)


class Preempted(StoppedTogether):
    """Every rank stopped at the same step boundary because one of them was asked to (a
    signal, its launcher gone), the checkpoint saved: exit :data:`EXIT_PREEMPTED`. `line`
    (rank 0's, naming the checkpoint; empty on the others) is the job's one line."""

    status = EXIT_PREEMPTED


def write_together(dist: DistContext, write: Callable[[], None], where: str) -> None:
    """Run `write` (this rank's writes: a no-op off rank 0), then agree with every rank
    on whether all of them succeeded.

    Every synchronous rank must call this at the same points. `where` (e.g. ``"step 24"``)
    names the point in the line the other ranks print. A lone or asynchronous worker
    (``dist_async`` workers never meet) raises its :class:`OutputError` as it is.
    """
    failed = None
    try:
        write()
    except OutputError as err:
        failed = err
    if dist.num_workers == 1 or not dist.synchronous:
        if failed is not None:
            raise failed
        return
    flags = [0.0] * dist.num_workers
    flags[dist.rank] = float(failed is not None)
    # The failure rides as a payload (each rank's line says it its own way, below).
    ranks = [rank for rank, flag in enumerate(dist.agree("outputs_written", payload=flags))
             if flag]
    if ranks:
        raise stopped_by_failed_write(dist, failed, ranks, where)


def stopped_by_failed_write(dist: DistContext, failed: Optional[OutputError], ranks: List[int],
                            where: str) -> StoppedTogether:
    """What every rank raises when `ranks` could not write their outputs: this rank's own
    failure (`failed`) as its line, or which ranks failed and where (`where`) all stopped."""
    if failed is not None:
        line = f"hvdtrain: error: {failed}"
    else:
        line = (f"hvdtrain: error: rank {', '.join(map(str, ranks))} could not write its "
                f"outputs (its own line says why); every rank stopped at {where}")
    return StoppedTogether(line, lambda: leave_together(dist))


def leave_together(dist: DistContext) -> None:
    """A last collective, then the store's orderly shutdown (Horovod's, where it has one):
    :func:`hvdtrain.store.agree.leave`, which an agreed error's ``leave`` calls too."""
    leave(dist)
