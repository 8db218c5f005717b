"""A rank ends itself when the launcher that started it is gone.

``horovodrun`` (MPI) replaces itself with ``/bin/sh -c mpirun ...``: a ``kill -TERM`` of the
horovodrun pid, which is what a supervisor, ``docker stop`` or a Kubernetes launcher pod
sends, ends that shell alone, and mpirun and every rank train on, orphaned. The rank's own
parent (mpirun) is still alive then, so the parent-death signal (``PR_SET_PDEATHSIG``) would
not fire; it also fires when the *thread* that forked the child exits, which horovodrun's
Gloo driver does. Instead each rank notes, at start-up, the chain of launcher processes above
it (mpirun, orted, the shell horovodrun became, horovodrun, hvdtrain-launch, remote.py) and a
thread checks once a second that each is still the process it was. When one is gone the rank
asks for the stop a signal asks for (`on_gone`: every rank stops at the next step boundary,
rank 0 saves a checkpoint, all exit; mpirun is usually still there to carry the
collectives), and after :data:`STOP_GRACE` seconds still there, or without `on_gone`, logs
one error line and leaves through ``os._exit``; mpirun then sees a failed rank and stops the
rest.

Only launcher processes are watched: a login shell, ``nohup`` or a batch script above the
launcher may come and go without touching the job. A launcher counts as gone only when that
is proven: its ``/proc`` entry no longer exists (ENOENT, ESRCH), it is a zombie, or its pid
now has another start time. Any other error reading ``/proc`` (EMFILE when this process has
no file descriptor left, EACCES) means "unknown": warned about once, and watched again. Linux only (reads ``/proc``); elsewhere
the chain is empty and nothing is watched.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

logger = logging.getLogger("hvdtrain")

EXIT_LAUNCHER_GONE = 128 + 15  # as if the TERM sent to the launcher had reached the rank
# Seconds a rank whose launcher is gone gives the job to stop at a step boundary with its
# checkpoint saved (the stop a signal asks for) before it exits regardless.
STOP_GRACE = 60.0
LAUNCHERS = frozenset({"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted",
                       "horovodrun", "hvdtrain-launch", "remote.py"})
SHELLS = frozenset({"sh", "bash", "dash"})


@dataclass(frozen=True)
class Ancestor:
    """A process above this one: pid, start time (to tell a reused pid) and a name."""

    pid: int
    start_time: str
    name: str


class Unreadable(Exception):
    """A process's ``/proc`` entry could not be read for a reason that says nothing about the
    process (a full file-descriptor table, a permission change): neither alive nor gone."""


def _stat(pid: int, proc: str):
    """(parent pid, state, start time) of `pid`, or None when it provably does not exist
    (no ``/proc`` entry: ENOENT, or ESRCH for a process that exited while being read).

    Raises
    ------
    Unreadable
        For any other error (EMFILE, ENFILE, ENOMEM, EACCES, a malformed line).
    """
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="utf-8") as src:
            text = src.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as err:
        raise Unreadable(f"cannot read {proc}/{pid}/stat: {err.strerror or err}") from None
    try:
        fields = text.rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0], fields[19]
    except (IndexError, ValueError):
        raise Unreadable(f"cannot parse {proc}/{pid}/stat: {text[:80]!r}") from None


def _argv(pid: int, proc: str) -> List[str]:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as src:
            return [a.decode(errors="replace") for a in src.read().split(b"\0") if a]
    except OSError:
        return []


def launcher_name(argv: List[str]) -> Optional[str]:
    """The launcher `argv` runs (``mpirun``, ``horovodrun``, ...), ``"sh -c mpirun"`` for a
    shell whose script starts a launcher (what horovodrun becomes), ``"sh -c"`` for another
    shell running a script, or None for anything else."""
    if not argv:
        return None
    names = [os.path.basename(argv[0])]
    if names[0].startswith("python") and len(argv) > 1:
        names.append(os.path.basename(argv[1]))  # a Python console script or remote.py
    for name in names:
        if name in LAUNCHERS:
            return name
    if names[0] in SHELLS and len(argv) > 2 and argv[1] == "-c":
        first = os.path.basename((argv[2].split() or [""])[0])
        return f"sh -c {first}" if first in LAUNCHERS else "sh -c"
    return None


def launcher_chain(pid: Optional[int] = None, proc: str = "/proc") -> List[Ancestor]:
    """The launcher processes above `pid` (default: this process), nearest first.

    Walks up while the ancestor is a launcher or a ``sh -c`` shell, then drops shells above
    the topmost launcher: those belong to whoever started the launcher.
    """
    chain: List[Ancestor] = []
    try:
        stat = _stat(pid or os.getpid(), proc)
        while stat is not None and stat[0] > 1:
            parent = stat[0]
            stat = _stat(parent, proc)
            name = launcher_name(_argv(parent, proc))
            if stat is None or name is None:
                break
            chain.append(Ancestor(parent, stat[2], name))
    except Unreadable as err:  # watch what was found so far rather than fail the start
        logger.warning("lifeline: %s; watching only %d launcher process(es)", err, len(chain))
    while chain and chain[-1].name == "sh -c":
        chain.pop()
    return chain


def is_alive(ancestor: Ancestor, proc: str = "/proc") -> bool:
    """False only when `ancestor` is provably gone: no ``/proc`` entry, a zombie, or its pid
    now belongs to another process (another start time).

    Raises
    ------
    Unreadable
        When its entry cannot be read: whether it lives is unknown.
    """
    stat = _stat(ancestor.pid, proc)
    return stat is not None and stat[1] not in ("Z", "X") and stat[2] == ancestor.start_time


class LauncherWatch:
    """Exit this process when any process of `chain` is gone.

    Parameters
    ----------
    chain : list of Ancestor
        What to watch (see :func:`launcher_chain`); empty: nothing is watched.
    describe : callable
        Returns who this process is, for the error line (e.g. ``"rank 1"``).
    """

    def __init__(self, chain: List[Ancestor], describe: Callable[[], str] = lambda: "this rank",
                 interval: float = 1.0, proc: str = "/proc",
                 exit: Callable[[int], None] = os._exit,  # pylint: disable=redefined-builtin,protected-access
                 on_gone: Optional[Callable[[str], bool]] = None, grace: float = STOP_GRACE,
                 clock: Callable[[], float] = time.monotonic):
        self.chain = chain
        self.describe = describe
        self.interval = interval
        self.proc = proc
        self._exit = exit
        self._on_gone = on_gone
        self._grace = grace
        self._clock = clock
        self._deadline: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._warned = False

    def check(self) -> bool:
        """Exit if a launcher process is provably gone; return whether one was.

        A ``/proc`` entry that cannot be read (e.g. EMFILE: this process has no file
        descriptor left) proves nothing: it is warned about once and checked again later.
        """
        for ancestor in self.chain:
            try:
                alive = is_alive(ancestor, self.proc)
            except Unreadable as err:
                if not self._warned:
                    logger.warning("%s: cannot tell whether its launcher %s (pid %d) is alive "
                                   "(%s); still watching", self.describe(), ancestor.name,
                                   ancestor.pid, err)
                    self._warned = True
                continue
            if not alive:
                return self._gone(ancestor)
        return False

    def _gone(self, ancestor: Ancestor) -> bool:
        """Launcher `ancestor` is gone: ask the job to stop with a checkpoint (`on_gone`) and
        give it the grace period, or exit now. Returns whether this process exits."""
        what = f"its launcher {ancestor.name} (pid {ancestor.pid}) is gone"
        if self._deadline is None and self._on_gone is not None and self._on_gone(what):
            self._deadline = self._clock() + self._grace
            logger.warning("%s: %s: every rank stops at the next step boundary with a "
                           "checkpoint saved; this rank exits in %.0f s at the latest",
                           self.describe(), what, self._grace)
            return False
        if self._deadline is not None and self._clock() < self._deadline:
            return False
        logger.error("%s: %s, so the job was stopped; exiting%s", self.describe(), what,
                     "" if self._deadline is None else
                     f" ({self._grace:.0f} s after asking for a stop with a checkpoint)")
        for handler in logger.handlers:
            handler.flush()
        sys.stderr.flush()
        self._exit(EXIT_LAUNCHER_GONE)
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            if self.check():
                return

    def __enter__(self) -> "LauncherWatch":
        if self.chain:
            self._thread = threading.Thread(target=self._watch, name="hvdtrain-lifeline",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
