"""An output folder belongs to one run at a time.

- A fresh run (no ``--resume``) is refused in a folder that already holds checkpoints: its
  saves would be pruned against the old run's, and a later ``--resume auto`` would pick the
  old run's newest.
- Rank 0 holds an ``fcntl`` lock on ``<output-dir>/.hvdtrain.lock`` while the run lives, so a
  second run into the same folder is refused instead of deleting the first one's temporary
  checkpoint and mixing its lines into ``metrics.jsonl``. The kernel drops the lock when the
  process ends, however it ends (``kill -9`` included), so a crash never leaves it stuck.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
from typing import Optional

import mxnet as mx

from .checkpoint import CHECKPOINTS, missing_files, named_checkpoints, clear_leftovers
from ..config import ConfigError
from .writes import check_writable_dir

LOCK_FILE = ".hvdtrain.lock"

logger = logging.getLogger("hvdtrain")


def refuse_if_in_use(output_dir: Optional[str]) -> None:
    """Refuse at once when another run holds `output_dir`, before its checkpoints are even
    read: they may be half-pruned under that run, and any advice about them (resume, start
    over) would be refused as well. :func:`claim` still takes the lock for real."""
    holder = OutputLock(output_dir).held_by_another() if output_dir else None
    if holder:
        raise ConfigError(f"--output-dir {output_dir} is in use by another run ({holder}): "
                          f"wait for it to end, or give another --output-dir")


def refuse_fresh_run(output_dir: Optional[str]) -> None:
    """Refuse a run without ``--resume`` into a folder holding another run's checkpoints."""
    if not output_dir:
        return
    found = [p for p in named_checkpoints(os.path.join(output_dir, CHECKPOINTS))
             if not missing_files(p)]
    if found:
        raise ConfigError(
            f"--output-dir {output_dir} already holds checkpoints of an earlier run (newest: "
            f"{os.path.basename(found[-1])}): continue it with --resume auto, or start over "
            f"in another --output-dir (or after deleting {os.path.join(output_dir, CHECKPOINTS)})")


class OutputLock:
    """Rank 0's exclusive claim on an output folder (``flock``, non-blocking)."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_FILE)
        self._file = None

    def acquire(self) -> bool:
        """Take the lock; False if another process holds it."""
        handle = open(self.path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        self._file = handle
        return True

    def held_by_another(self) -> Optional[str]:
        """Who holds the lock now, if another process does; the file is left as it is."""
        try:
            probe = open(self.path, encoding="utf-8")  # pylint: disable=consider-using-with
        except OSError:
            return None
        with probe:
            try:
                fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return self.holder()
            fcntl.flock(probe.fileno(), fcntl.LOCK_UN)
        return None

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it."""
        try:
            with open(self.path, encoding="utf-8") as src:
                lines = [line.strip() for line in src if line.strip()]
            return lines[-1] if lines else "another process"  # "pid N on HOST"
        except OSError:
            return "another process"

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def claim(output_dir: Optional[str], dist) -> Optional[OutputLock]:
    """Rank 0 checks `output_dir` is writable, locks it and clears what interrupted saves
    left; every rank learns (one collective) whether the folder was free, and all refuse
    together when it was not. Returns the lock to release at the end (rank 0)."""
    if not output_dir:
        return None
    lock, busy = None, 0
    if dist.is_root:
        check_writable_dir(output_dir, "--output-dir")
        lock = OutputLock(output_dir)
        busy = 0 if lock.acquire() else 1
        if not busy:
            removed = clear_leftovers(os.path.join(output_dir, CHECKPOINTS))
            if removed:
                logger.warning("removed what interrupted saves left in %s: %s",
                               os.path.join(output_dir, CHECKPOINTS), ", ".join(removed))
    if dist.num_workers > 1 and dist.synchronous:
        busy = int(dist.sum_across_workers("output_check", mx.nd.array([busy])).asscalar())
    if not busy:
        return lock
    if dist.is_root:
        raise ConfigError(f"--output-dir {output_dir} is in use by another run "
                          f"({lock.holder()} holds {lock.path}): wait for it to end, or give "
                          f"another --output-dir")
    raise ConfigError(f"rank 0 found --output-dir {output_dir} in use by another run")
