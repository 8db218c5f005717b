"""The job's pulse: each rank learns, without waiting on the training collectives, whether any
rank is making progress.

A rank that waits in a collective cannot tell a peer that is busy (rank 0 writing a
checkpoint to slow storage) from one that is frozen. A :class:`JobPulse` thread in every
rank exchanges a few numbers with every other rank, every `interval` seconds, on its own
small collective: each rank's count of completed steps, whether it is busy with work of its
own (:meth:`Watchdog.busy`), its phase, how long ago it last progressed, and whether it
has finished. When a round shows progress anywhere (a count moved, or a rank is busy), this rank's
:class:`Watchdog` hears of it. A frozen or dead rank never joins the next round, so the
others hear nothing and their watchdogs fire after ``--stall-timeout``.

The pulse ends only after a round in which every rank has finished: the result of a round
is the same on every rank, so all leave after the same round and none waits for a round
the others will never join. After an error (a ``fit`` that raised) a rank waits two rounds
for that; then it leaves its pulse alone, which makes no round again. Each pulse has a
collective of its own (``hvdtrain.pulse.<n>``, the n-th of the process, the same on every
rank: the ranks start their fits in step), so a pulse left in a round by a failed ``fit``
never meets the next ``fit``'s.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Callable, List, Optional

import numpy as np

from ..ecosystem import HOROVOD_SHUT_DOWN
from .watchdog import PHASES, Watchdog

logger = logging.getLogger("hvdtrain")

PULSE_NAME = "hvdtrain.pulse"
FIELDS = 5  # per rank: steps (mod 2**20), phase, busy, seconds since progress, finished
_COUNT_MODULUS = 1 << 20  # exact in float32, which the exchange sums in


class JobPulse:
    """Exchange progress with every rank from a thread of its own.

    Parameters
    ----------
    watchdog : Watchdog
        Hears of progress on any rank; supplies this rank's own state.
    exchange : callable
        Sums a float32 numpy vector over all ranks and returns the sum (every rank calls it
        with the same length); it runs on the pulse thread, never on the training thread.
    rank, num_workers : int
        This rank and the world size.
    interval : float
        Seconds between rounds.
    """

    _started = itertools.count()  # pulses this process started: each one's collective name

    def __init__(self, watchdog: Watchdog, exchange: Callable[[np.ndarray], np.ndarray],
                 rank: int, num_workers: int, interval: float):
        self.watchdog = watchdog
        self._exchange = exchange
        self.rank = rank
        self.num_workers = num_workers
        self.interval = interval
        self._finished = threading.Event()
        self._abandoned = threading.Event()  # a failed fit: make no further round
        self._last_counts: Optional[List[int]] = None
        self.ended: List[int] = []  # ranks a round showed finished (or failed), in order
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def watch(cls, watchdog: Watchdog, dist) -> Optional["JobPulse"]:
        """Start a pulse over `dist` (a DistContext) for `watchdog`, and attach it (the
        watchdog's ``stop`` ends it); None when there is nothing to watch: the watchdog is
        off, the rank is alone, or the store cannot reduce from a second thread (MXNet's
        parameter-server stores, whose workers keep the step-only watchdog)."""
        if not watchdog.timeout or dist.num_workers == 1 or \
                not hasattr(dist.store, "sum_exact"):
            return None

        name = f"{PULSE_NAME}.{next(cls._started)}"

        def exchange(vector):
            import mxnet as mx  # pylint: disable=import-outside-toplevel
            return dist.sum_across_workers(name, mx.nd.array(vector)).asnumpy()

        watchdog.pulse = cls(watchdog, exchange, dist.rank, dist.num_workers,
                             interval=min(5.0, watchdog.timeout / 6))
        return watchdog.pulse.start()

    def start(self) -> "JobPulse":
        self._thread = threading.Thread(target=self._run, name="hvdtrain-pulse", daemon=True)
        self._thread.start()
        return self

    def finish(self, timeout: Optional[float] = None) -> bool:
        """Say this rank has finished and wait until every rank has (or `timeout` passes);
        return whether the pulse ended. Meanwhile the watchdog still watches: a peer that
        freezes now ends this rank as it would in training."""
        self._finished.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def abandon(self, wait: float) -> bool:
        """After an error: say this rank has finished and wait up to `wait` seconds for a
        round in which every rank has (all of them failed alike); else make no further
        round. Returns whether the pulse ended in step with the others."""
        if self.finish(wait):
            return True
        self._abandoned.set()
        return False

    def vector(self) -> np.ndarray:
        """This rank's part of a round: zeros except for its own fields."""
        mine = np.zeros(FIELDS * self.num_workers, dtype=np.float32)
        dog = self.watchdog
        mine[self.rank::self.num_workers] = (
            dog.beats % _COUNT_MODULUS, PHASES.index(dog.phase()), bool(dog.busy_phase),
            min(dog.idle(), 1e6), self._finished.is_set())
        return mine

    def observe(self, total: np.ndarray) -> bool:
        """Read one round's sum; tell the watchdog of every rank's state and whether any
        progressed; return whether every rank has finished."""
        counts, phases, busy, idle, finished = total.reshape(FIELDS, self.num_workers)
        counts = [int(c) for c in counts]
        moved = self._last_counts is not None and counts != self._last_counts
        self._last_counts = counts
        states = {r: PHASES[int(phases[r])] + (" (busy)" if busy[r] else
                                              f", last progress {idle[r]:.0f} s before")
                  for r in range(self.num_workers)}
        self.watchdog.heard(states, progress=moved or bool(busy.any()))
        self.ended += [r for r in range(self.num_workers) if finished[r] and r not in self.ended]
        return bool(finished.sum() >= self.num_workers)

    def _run(self) -> None:
        failed = False  # the round before failed on this rank
        while not self._abandoned.is_set():
            try:
                if self.observe(np.asarray(self._exchange(self.vector()))):
                    return
            except Exception as err:  # pylint: disable=broad-except
                if HOROVOD_SHUT_DOWN in str(err):
                    # Another rank failed or left: the training thread's next call says so.
                    logger.debug("the job's pulse stopped: %s", HOROVOD_SHUT_DOWN)
                    return
                why = str(err).splitlines()[0] if str(err) else type(err).__name__
                if failed:
                    # If Horovod did not shut down, the user should know that slow peers
                    # now look stalled.
                    logger.warning("%s: the job's pulse stopped (%s); the stall watchdog "
                                   "now counts only this rank's own progress",
                                   self.watchdog.who(), why)
                    return
                # Once, at once: the others wait in this round, and a pulse that left it
                # would keep them there until a healthy job's end (every rank's watchdog
                # then fires, each blaming the other).
                logger.warning("%s: a round of the job's pulse failed here (%s); making it "
                               "again", self.watchdog.who(), why)
                failed = True
                continue
            failed = False
            self._finished.wait(self.interval)
