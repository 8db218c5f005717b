"""The stall watchdog: a rank that makes no progress for too long ends itself.

A frozen rank (SIGSTOP, a hung driver, a dead NFS mount) blocks every other rank in the
next collective. Under MPI, Horovod's own stall check runs on rank 0's background thread,
which is itself blocked negotiating with the frozen rank, so it never fires and the job hangs
forever. This watchdog is a plain thread in every rank: each completed training or evaluation
step calls :meth:`Watchdog.beat`; when none has come for ``timeout`` seconds the rank logs one
error naming itself and its last step and leaves through ``os._exit`` at once (a normal exit
would wait in Horovod's or ps-lite's shutdown for the frozen peer). Its launcher (horovodrun,
mpirun, hvdtrain-launch) then sees a failed rank and tears the whole job down.

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
from typing import Callable, Dict, Mapping, Optional

logger = logging.getLogger("hvdtrain")

EXIT_STALLED = 1
STALL_CHECK_ENV = "HOROVOD_STALL_CHECK_TIME_SECONDS"
STALL_SHUTDOWN_ENV = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
# Horovod's own default warning time; kept when the timeout leaves room for it.
HOROVOD_WARNING_SECONDS = 60


def horovod_stall_env(timeout: float, environ: Mapping[str, str]) -> Dict[str, str]:
    """Horovod's stall variables matching `timeout` (0: watchdog off, nothing to set).

    Horovod warns about a stalled tensor after the check time and shuts down after the
    shutdown time; under Gloo a collective fails after the Gloo timeout. The warning (which
    names the ranks that are missing) comes at half the timeout (at most Horovod's usual
    60 s). The shutdown and the Gloo timeout are a backstop at 1.5 times the timeout: the
    watchdog fires first and says which rank stopped and where, whereas Horovod's shutdown
    is a traceback on every rank. Shorter Horovod limits would also end a healthy job whose
    rank 0 spends minutes on a checkpoint while the others wait in the next allreduce. A
    variable the user set is left alone.
    """
    if not timeout:
        return {}
    backstop = str(max(2, math.ceil(1.5 * timeout)))
    check = max(1, min(HOROVOD_WARNING_SECONDS, math.ceil(timeout) // 2))
    wanted = {STALL_CHECK_ENV: str(check), STALL_SHUTDOWN_ENV: backstop,
              GLOO_TIMEOUT_ENV: backstop}
    return {name: value for name, value in wanted.items() if name not in environ}


class Watchdog:
    """End this process when :meth:`beat` has not been called for `timeout` seconds.

    Parameters
    ----------
    timeout : float
        Seconds without a completed step before the rank gives up; 0 disables the watchdog.
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
        self._last_beat = clock()
        self._last_step = "none yet (starting up)"
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
        self._last_beat = self._clock()

    def start(self) -> "Watchdog":
        if self.timeout and self._thread is None:
            self._last_beat = self._clock()
            self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    def check(self) -> bool:
        """Fire if the timeout has passed; return whether it fired."""
        idle = self._clock() - self._last_beat
        if idle < self.timeout:
            return False
        # A frozen rank cannot say so itself: the ranks that report are usually the ones
        # left waiting for it in a collective, so the line says "waited", not "is frozen".
        logger.error("%s waited %.0f s with no step completed (--stall-timeout %g; last "
                     "completed: %s): this rank, or one it waits for, is frozen or hung; "
                     "exiting so the launcher stops the job",
                     self.who(), idle, self.timeout, self._last_step)
        for handler in logger.handlers:
            handler.flush()
        sys.stderr.flush()
        self._exit(EXIT_STALLED)
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            if self.check():
                return
