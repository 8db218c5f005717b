"""A signal asks the job to save a checkpoint and stop; a second one ends this rank at once.

SIGTERM, SIGUSR1 and SIGINT are how a cluster says "leave soon": Slurm (``--signal``,
``scancel``, the time limit), Kubernetes (``terminationGracePeriodSeconds``), a spot
instance's notice, Ctrl-C. On the first one a rank only takes note
(:attr:`StopSignals.received`); the training loop adds that note to the vote every rank casts
with its step counts, so all ranks stop at the same step boundary, rank 0 saves, and every
rank exits with :data:`hvdtrain.config.EXIT_PREEMPTED` (75; hvdtrain/loop/run/boundary.py). A rank
never stops on its own at a signal: its peers would be left inside their next collective.

A second signal ends the rank at once (``os._exit(128 + signal)``): whatever checkpoint was
being written then is left as a hidden temporary folder, never as the newest checkpoint. The
signal is read by a thread from Python's wakeup file descriptor, not by a Python-level
handler, because the main thread spends most of a step inside MXNet or Horovod (ctypes
calls), where a Python handler waits until the call returns. A repeat within
:data:`REPEAT_WINDOW` seconds of the first is the same request delivered twice (Ctrl-C
reaches a rank from the terminal and again from a launcher that forwards it), not a second
one.

The handlers are installed for the run only and the previous ones put back after, so a
program that calls :func:`hvdtrain.job.train` keeps its own outside it. Only the main thread
can install them; elsewhere nothing is installed and a signal acts as it would without
hvdtrain.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Dict, Optional

logger = logging.getLogger("hvdtrain")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
REPEAT_WINDOW = 2.0  # seconds within which another signal is the first one delivered again
_WAKE_UP = 0  # the byte that ends the reading thread (no signal has number 0)
JOIN_WAIT = 5.0  # seconds the end of a run waits for the reading thread


class StopSignals:
    """Note the first stop signal; end this process at a second.

    Parameters
    ----------
    describe : callable
        Returns who this process is, for the log lines (e.g. ``"rank 1"``).
    clock, exit
        Injected for tests: the time source and what ends the process.

    Use as ``with StopSignals(...) as signals:``; :attr:`received` is then None until a
    stop signal came, and its name (``"SIGTERM"``) after.
    """

    def __init__(self, describe: Callable[[], str] = lambda: "this rank",
                 clock: Callable[[], float] = time.monotonic,
                 exit: Callable[[int], None] = os._exit):  # pylint: disable=redefined-builtin,protected-access
        self.describe = describe
        self.received: Optional[str] = None
        self._clock = clock
        self._exit = exit
        self._first_at = 0.0
        self._previous: Dict[int, object] = {}
        self._previous_fd = -1
        self._pipe = None
        self._thread: Optional[threading.Thread] = None

    def notice(self, signum: int) -> None:
        """What the reading thread does with a signal: note the first (and say what happens
        next), end the process at a second one that is not the first delivered again."""
        name = signal.Signals(signum).name
        now = self._clock()
        if self.received is None:
            self.received, self._first_at = name, now
            logger.warning("%s: got %s: every rank stops at the next step boundary and a "
                           "checkpoint is saved (a second signal ends it at once)",
                           self.describe(), name)
            return
        if now - self._first_at < REPEAT_WINDOW:
            return
        logger.error("%s: got %s while stopping for %s: exiting at once (a checkpoint being "
                     "written now is not used; --resume auto takes the newest complete one)",
                     self.describe(), name, self.received)
        for handler in logger.handlers:
            handler.flush()
        sys.stderr.flush()
        self._exit(128 + signum)

    def request(self, reason: str) -> bool:
        """Ask for the same stop as a signal does, for `reason` (e.g. the launcher is gone);
        False when the handlers are not installed (nothing would act on it)."""
        if self._pipe is None:
            return False
        if self.received is None:
            self.received = reason
        return True

    def _read(self, fd: int) -> None:
        """The reading thread: act on each signal's byte until the wake-up byte or the end
        of the pipe. It owns `fd` and closes it when it ends, so that no other thread ever
        closes a descriptor this one may still read (its number could be reused by then)."""
        try:
            while True:
                try:
                    data = os.read(fd, 64)
                except InterruptedError:
                    continue
                except OSError:
                    return
                if not data:  # the write end is closed: nothing more can come
                    return
                for signum in data:
                    if signum == _WAKE_UP:
                        return
                    if signum in STOP_SIGNALS:
                        self.notice(signum)
        finally:
            os.close(fd)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not the main thread: stop signals keep their own handlers")
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler must never block on it
        self._pipe = (read_fd, write_fd)
        for signum in STOP_SIGNALS:
            # The Python-level handler does nothing: the C handler beneath it writes the
            # signal's number to the wakeup fd at once, and the thread acts on it.
            self._previous[signum] = signal.signal(signum, lambda *_: None)
        self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._read, args=(read_fd,),
                                        name="hvdtrain-signals", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._previous_fd)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        os.write(self._pipe[1], bytes([_WAKE_UP]))
        # The thread closes the read end when it ends: not here, even when it has not ended
        # within the wait (busy logging a signal's line), as it may still read from it.
        os.close(self._pipe[1])
        self._thread.join(timeout=JOIN_WAIT)
        if self._thread.is_alive():
            logger.debug("the stop-signal thread is still busy; it ends by itself")
        self._pipe, self._thread = None, None
