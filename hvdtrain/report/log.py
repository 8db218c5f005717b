"""Rank-aware logging and the metrics file.

Every rank logs warnings and errors (a problem on rank 3 must not vanish); only rank 0 logs
INFO, so a job prints one clean line per epoch however many ranks it has.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Optional

from ..state.writes import write_failure

LOGGER_NAME = "hvdtrain"


class _StderrHandler(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record comes.

    ``StreamHandler(sys.stderr)`` keeps the stream it was given; a tool that replaces
    ``sys.stderr`` later (pytest's capture, a notebook) would leave it writing, or
    flushing from the watchdog's thread, into a closed file."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def error_line(text: str) -> None:
    """Write one line to stderr in a single write.

    ``print`` writes the text and its newline separately; mpirun tags each piece it
    reads, so the line would run into the next rank's tag."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# Where launchers put a process's rank: horovodrun with Gloo, then Open MPI, MPICH/PMI, PMIx.
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def launch_rank(environ=os.environ) -> int:
    """This process's rank as its launcher numbered it (0 when none did): the tag for the
    lines logged before the store knows the rank."""
    for name in RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def setup_logging(rank: int, stream=None) -> logging.Logger:
    """Configure the ``hvdtrain`` logger for a process of rank `rank`.

    Calling it again (e.g. once the rank is known) replaces the previous handler.
    """
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False
    return logger


def info_on_every_rank(logger: logging.Logger, message: str, *args) -> None:
    """Log an INFO line on every rank, not only rank 0: for what differs between ranks
    (e.g. which GPU each took). Handing the record to the handlers directly skips the
    logger's level, which keeps other ranks' INFO lines quiet."""
    if not logger.disabled:
        logger.handle(logger.makeRecord(logger.name, logging.INFO, "(hvdtrain)", 0, message,
                                        args, None))


class MetricsWriter:
    """Append one JSON object per line to ``metrics.jsonl``; only on the root rank.

    The file is opened in append mode and each line is flushed and fsynced, so a crash loses
    at most the line being written and never what earlier epochs (or runs) wrote.

    Parameters
    ----------
    path : str or None
        Where to write; None (or ``enabled=False``) makes every call a no-op.
    enabled : bool
        False on every rank but the root.
    """

    def __init__(self, path: Optional[str], enabled: bool = True):
        self.path = path if enabled else None
        self._checked_end = False
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def _cut_last_line(self) -> bool:
        """Whether the file ends inside a line (a crash mid-write): the next record must
        then start on a fresh line instead of being glued onto the damaged one."""
        try:
            with open(self.path, "rb") as src:
                src.seek(0, os.SEEK_END)
                if src.tell() == 0:
                    return False
                src.seek(-1, os.SEEK_END)
                return src.read(1) != b"\n"
        except FileNotFoundError:
            return False

    def write(self, event: str, **fields) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, **fields}, sort_keys=False)
        if not self._checked_end:
            self._checked_end = True
            if self._cut_last_line():
                line = "\n" + line
        with open(self.path, "a", encoding="utf-8") as out:
            size = out.tell()
            try:
                out.write(line + "\n")
                out.flush()
                os.fsync(out.fileno())
            except OSError as err:  # e.g. a full disk: leave no half line behind
                failure = write_failure(self.path, err)
                os.truncate(self.path, size)
                raise failure from None
