"""A rank ends itself when the launcher that started it is gone.

``horovodrun`` (MPI) replaces itself with ``/bin/sh -c mpirun ...``: a ``kill -TERM`` of the
horovodrun pid, which is what a supervisor, ``docker stop`` or a Kubernetes launcher pod
sends, ends that shell alone, and mpirun and every rank train on, orphaned. The rank's own
parent (mpirun) is still alive then, so the parent-death signal (``PR_SET_PDEATHSIG``) would
not fire; it also fires when the *thread* that forked the child exits, which horovodrun's
Gloo driver does. Instead each rank notes, at start-up, the chain of launcher processes above
it (mpirun, orted, the shell horovodrun became, horovodrun, hvdtrain-launch, remote.py) and a
thread checks once a second that each is still the process it was. When one is gone the rank
logs one error line and leaves through ``os._exit``; mpirun then sees a failed rank and stops
the rest.

Only launcher processes are watched: a login shell, ``nohup`` or a batch script above the
launcher may come and go without touching the job. Linux only (reads ``/proc``); elsewhere
the chain is empty and nothing is watched.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional

logger = logging.getLogger("hvdtrain")

EXIT_LAUNCHER_GONE = 128 + 15  # as if the TERM sent to the launcher had reached the rank
LAUNCHERS = frozenset({"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted",
                       "horovodrun", "hvdtrain-launch", "remote.py"})
SHELLS = frozenset({"sh", "bash", "dash"})


@dataclass(frozen=True)
class Ancestor:
    """A process above this one: pid, start time (to tell a reused pid) and a name."""

    pid: int
    start_time: str
    name: str


def _stat(pid: int, proc: str):
    """(parent pid, state, start time) of `pid`, or None when it does not exist."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="utf-8") as src:
            fields = src.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]


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
    stat = _stat(pid or os.getpid(), proc)
    while stat is not None and stat[0] > 1:
        parent = stat[0]
        stat = _stat(parent, proc)
        name = launcher_name(_argv(parent, proc))
        if stat is None or name is None:
            break
        chain.append(Ancestor(parent, stat[2], name))
    while chain and chain[-1].name == "sh -c":
        chain.pop()
    return chain


def is_alive(ancestor: Ancestor, proc: str = "/proc") -> bool:
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
                 exit: Callable[[int], None] = os._exit):  # pylint: disable=redefined-builtin,protected-access
        self.chain = chain
        self.describe = describe
        self.interval = interval
        self.proc = proc
        self._exit = exit
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def check(self) -> bool:
        """Exit if a launcher process is gone; return whether one was."""
        for ancestor in self.chain:
            if not is_alive(ancestor, self.proc):
                logger.error("%s: its launcher %s (pid %d) is gone, so the job was stopped; "
                             "exiting", self.describe(), ancestor.name, ancestor.pid)
                for handler in logger.handlers:
                    handler.flush()
                sys.stderr.flush()
                self._exit(EXIT_LAUNCHER_GONE)
                return True
        return False

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
