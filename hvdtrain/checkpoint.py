"""Writing model files so that a crash never leaves a half-written one behind."""
from __future__ import annotations

import os
from typing import Callable


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call ``write(tmp_path)``, fsync the result, then rename it to `path`.

    A reader (or a crash) sees either the old file or the complete new one.
    """
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_dir(folder)
    return path


def _fsync_dir(folder: str) -> None:
    """Make a rename in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_params(net, path: str) -> str:
    """Save `net`'s parameters (Gluon ``save_parameters`` format) atomically to `path`."""
    return atomic_write(path, net.save_parameters)
