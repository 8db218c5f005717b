"""Whether outputs can be written, and one line saying why when they cannot.

Output folders are checked before a run writes anything (a usage error, exit 2). A write
that fails later, typically a full disk during a checkpoint or a metrics line, raises
:class:`OutputError` (exit 1) naming the path; the writer has already cleaned up after
itself, so what earlier epochs wrote stays intact.
"""
from __future__ import annotations

import errno
import os
from typing import Callable

from ..config import ConfigError

# Below this much free space a failed write is put down to a full disk: MXNet reports a
# short write as "FileStream.Write incomplete", without the errno.
FULL_DISK_BYTES = 1 << 20


class OutputError(RuntimeError):
    """An output that could not be written; its message is one line naming the path."""


def check_writable_dir(path: str, flag: str) -> None:
    """Create folder `path` if needed and check that a file can be written in it.

    Raises :class:`ConfigError` naming `flag` (e.g. ``--output-dir``) when it cannot: a path
    under /proc, a path naming a file, a read-only or full file system.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".hvdtrain-write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as err:
        raise ConfigError(f"{flag} {path} is not writable: {err.strerror}") from None


def _free_bytes(path: str) -> int:
    folder = os.path.abspath(path)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        stat = os.statvfs(folder)
    except OSError:
        return FULL_DISK_BYTES
    return stat.f_bavail * stat.f_frsize


def write_failure(path: str, err: BaseException) -> OutputError:
    """The :class:`OutputError` for a failed write of `path`.

    Call it before cleaning up: whether the disk is full is read from the free space now.
    """
    if isinstance(err, OSError):
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
        reason = "no space left on device" if full else (err.strerror or str(err))
    elif _free_bytes(path) < FULL_DISK_BYTES:
        reason = "no space left on device"
    else:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
    return OutputError(f"cannot write {path}: {reason}")


def fsync_path(path: str) -> None:
    """fsync a file or folder (so that a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call ``write(tmp_path)``, fsync the result, then rename it to `path`.

    A reader (or a crash) sees either the old file or the complete new one.
    """
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    failure = None
    try:
        write(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
    except Exception as err:  # MXNet reports a short write as MXNetError
        failure = write_failure(path, err)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    if failure is not None:
        raise failure
    fsync_path(folder)
    return path
