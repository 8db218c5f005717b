"""The stall watchdog: a rank ends itself only when the whole job has made no progress for
``--stall-timeout`` seconds.

A frozen rank (SIGSTOP, a hung driver, a lost host) blocks every other rank in the next
collective. Under MPI, Horovod's own stall check runs on rank 0's background thread, which is
itself blocked negotiating with the frozen rank, so it never fires and the job hangs
forever. This watchdog is a plain thread in every rank. Progress is: a completed training or
evaluation step, a start-up milestone (:meth:`Watchdog.beat`), a rank busy with work of its
own (:meth:`Watchdog.busy`: rank 0 writing a checkpoint or the final parameters), and, heard
through the job's pulse (:mod:`hvdtrain.runtime.pulse`), any of these on another rank. So a
rank waiting in a collective for rank 0 while rank 0 writes to slow storage is not stalled.
When no progress has come from anywhere for ``timeout`` seconds, the rank logs one error
naming itself, its phase and what it last heard from every rank, and leaves through
``os._exit`` at once (a normal exit would wait in Horovod's or ps-lite's shutdown for the
frozen peer). Its launcher (horovodrun, mpirun, hvdtrain-launch) then sees a failed rank and
tears the whole job down. A busy phase is never cut short: a write that takes an hour is the
user's to end (a warning says what the rank is doing every ``timeout`` seconds).

The thread runs while the main thread waits inside MXNet or Horovod: those calls go through
ctypes, which releases the GIL.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Mapping, Optional, Tuple

logger = logging.getLogger("hvdtrain")

EXIT_STALLED = 1
STALL_CHECK_ENV = "HOROVOD_STALL_CHECK_TIME_SECONDS"
STALL_SHUTDOWN_ENV = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
HOROVOD_GLOO_TIMEOUT_SECONDS = 30  # Horovod 0.28.1's default (gloo_context.cc)
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
# Horovod's own default warning time; kept when the timeout leaves room for it.
HOROVOD_WARNING_SECONDS = 60
# What a rank may be busy with on its own while the others wait for it (the job's pulse
# sends the index).
ELASTIC_RESET = "an elastic reset (Horovod's driver gathers the workers)"
# A hvdtrain.horovod script between two of hvdtrain's calls: its own work (a validation, a
# save) may take any time, and is not cut short while every rank still answers the pulse;
# only a peer that stops answering ends it (hvdtrain/horovod/session.py).
SCRIPT_WORK = "the script's own work"
BUSY_PHASES = ("writing a checkpoint", "saving the final parameters", ELASTIC_RESET,
               SCRIPT_WORK)
# Every phase a rank reports (the pulse sends the index): what its last completed step
# names, or what it is busy with.
PHASES = ("start-up", "training", "evaluation") + BUSY_PHASES


def gloo_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds a Gloo collective waits for a peer: the user's, else Horovod's 30."""
    return float(environ.get(GLOO_TIMEOUT_ENV, HOROVOD_GLOO_TIMEOUT_SECONDS))


def horovod_stall_env(timeout: float, environ: Mapping[str, str],
                      elastic: bool = False) -> Dict[str, str]:
    """Horovod's variables matching `timeout` (0: watchdog off, nothing to set).

    Horovod warns about a stalled tensor after the check time: the warning, which names
    the ranks that have not submitted it, comes at half the timeout (at most Horovod's usual
    60 s). No stall *shutdown* is set (Horovod's default: none): Horovod shuts down when some
    ranks have waited that long for a tensor, which is also the case while rank 0 writes a
    checkpoint to slow storage and the others wait in the next allreduce, so it would end a
    healthy job; the watchdog decides instead, from progress on every rank. Under Gloo a
    collective fails after the Gloo timeout, which only a dead or frozen rank reaches
    (Horovod's background threads keep exchanging while a rank is busy): it is a backstop at
    1.5 times the timeout, after the watchdog's own line. A variable the user set is left
    alone.

    `elastic`: the Gloo timeout is then how a lost peer is found (the others roll back and
    go on), so it is left to Horovod (30 s unless the user sets it), below the watchdog's.
    """
    if not timeout:
        return {}
    backstop = str(max(2, math.ceil(1.5 * timeout)))
    check = max(1, min(HOROVOD_WARNING_SECONDS, math.ceil(timeout) // 2))
    wanted = {STALL_CHECK_ENV: str(check)}
    if not elastic:
        wanted[GLOO_TIMEOUT_ENV] = backstop
    return {name: value for name, value in wanted.items() if name not in environ}


class Watchdog:
    """End this process when no progress has come from anywhere for `timeout` seconds.

    Parameters
    ----------
    timeout : float
        Seconds without progress on any rank before this rank gives up; 0 disables it.
    rank : int or None
        This rank, named in the error line (None until known: see :meth:`set_rank`).
    clock, exit, interval
        Injected for tests: the time source, what ends the process, seconds between checks.
    """

    def __init__(self, timeout: float, rank: Optional[int] = None,
                 clock: Callable[[], float] = time.monotonic,
                 exit: Callable[[int], None] = os._exit,  # pylint: disable=redefined-builtin,protected-access
                 interval: Optional[float] = None):
        self.timeout = timeout
        self.rank = rank
        self._clock = clock
        self._exit = exit
        self._interval = interval if interval is not None else min(1.0, timeout / 10 or 1.0)
        self._last_beat = self._last_progress = self._last_warning = clock()
        self._last_step = "none yet (starting up)"
        self.beats = 0  # completed steps and milestones of this rank (the pulse sends it)
        self.busy_phase: Optional[str] = None
        self._heard: Tuple[Dict[int, str], Optional[float]] = ({}, None)  # pulse: states, when
        self.pulse = None  # a JobPulse, ended by stop()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def set_rank(self, rank: int) -> None:
        self.rank = rank

    def who(self) -> str:
        """This process as the error lines name it."""
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"process {os.getpid()} (before its rank is known)"

    def beat(self, step: str) -> None:
        """Record that `step` (e.g. ``"training step 40"``) just completed."""
        self._last_step = step
        self.beats += 1
        self._last_beat = self._last_progress = self._clock()

    def phase(self) -> str:
        """This rank's phase, one of :data:`PHASES`: what it is busy with, else the kind of
        step it last completed."""
        if self.busy_phase:
            return self.busy_phase
        return next((p for p in PHASES[1:3] if self._last_step.startswith(p)), PHASES[0])

    def idle(self) -> float:
        """Seconds since this rank itself last progressed (0 while it is busy)."""
        return 0.0 if self.busy_phase else self._clock() - self._last_beat

    @contextmanager
    def busy(self, phase: str) -> Iterator[None]:
        """This rank works on its own (`phase`, one of :data:`BUSY_PHASES`) while the others
        may wait for it: progress for as long as it lasts, on this rank and, through the
        pulse, on the ranks waiting for it."""
        self.busy_phase = phase
        try:
            yield
        finally:
            self.busy_phase = None
            self.beat(f"{phase} (done)")

    def heard(self, states: Dict[int, str], progress: bool) -> None:
        """The job's pulse reports every rank's state (rank: phase and how long since it
        progressed); `progress`: some rank progressed since the last report."""
        now = self._clock()
        self._heard = (states, now)
        if progress:
            self._last_progress = now

    def start(self) -> "Watchdog":
        if self.timeout and self._thread is None:
            self._last_beat = self._last_progress = self._last_warning = self._clock()
            self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, finish_pulse: bool = True) -> None:
        """Stop watching; with `finish_pulse`, first wait (still watched) until every rank
        has finished, so no rank is left in a pulse round the others never join. Without
        (after an error, when the others may never finish) the pulse waits two of its
        rounds for them and is then left to make no further round: a ``fit`` that raised
        on every rank alike leaves no pulse behind."""
        if self.pulse is not None:
            if finish_pulse:
                self.pulse.finish()
            else:
                self.pulse.abandon(2 * self.pulse.interval)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, exc_type, *_exc) -> None:
        # After an error the other ranks may never finish: do not wait for them.
        self.stop(finish_pulse=exc_type is None)

    def check(self) -> bool:
        """Fire if no progress has come from anywhere for the timeout; return whether it
        fired. While this rank is busy it never fires, and warns every `timeout` seconds."""
        now = self._clock()
        if self.busy_phase == SCRIPT_WORK:
            # No warnings: a script's validation is not a stall. Only a pulse gone quiet
            # for the timeout (a peer frozen or dead) ends the rank; alone, nothing does.
            self._last_progress = now
            if self.pulse is None:
                return False
            heard = self._heard[1] if self._heard[1] is not None else self._last_beat
            if now - heard < self.timeout:
                return False
            return self._fire(now - heard, now)
        if self.busy_phase:
            self._last_progress = now
            if now - self._last_beat >= self.timeout and \
                    now - self._last_warning >= self.timeout:
                self._last_warning = now
                logger.warning("%s has been %s for %.0f s; the other ranks wait for it",
                               self.who(), self.busy_phase, now - self._last_beat)
            return False
        idle = now - self._last_progress
        if idle < self.timeout:
            return False
        return self._fire(idle, now)

    def _fire(self, idle: float, now: float) -> bool:
        logger.error("%s: no progress on any rank for %.0f s, with no step completed here "
                     "(--stall-timeout %g; this rank's last completed: %s); %s; exiting so "
                     "the launcher stops the job", self.who(), idle, self.timeout,
                     self._last_step, self._diagnosis(now))
        for handler in logger.handlers:
            handler.flush()
        sys.stderr.flush()
        self._exit(EXIT_STALLED)
        return True

    def _diagnosis(self, now: float) -> str:
        """Which rank stopped, and in which phase, as far as this rank can tell."""
        states, when = self._heard
        if when is None:
            return "never heard from the other ranks: one of them is frozen, dead or hung"
        listed = "; ".join(f"rank {r}: {state}" for r, state in sorted(states.items()))
        # A frozen or dead rank cannot say so itself, and joins no further round of the
        # pulse: when the pulse has gone quiet too, a rank other than this one stopped then.
        if now - when >= self.timeout / 2:
            others = [r for r in sorted(states) if r != self.rank]
            who = (f"rank {others[0]}" if len(others) == 1 else
                   "one of ranks " + ", ".join(map(str, others)))
            return (f"no rank has answered for {now - when:.0f} s: {who} stopped (frozen, "
                    f"dead or cut off); at the last answer: {listed}")
        # Every rank still answers, so all are alive: the one that stopped progressing first
        # is stuck.
        return f"every rank answers ({now - when:.0f} s ago), none progresses: {listed}"

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            if self.check():
                return
