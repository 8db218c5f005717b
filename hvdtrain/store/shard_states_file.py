"""``Trainer.save_states``'s file written while its arrays arrive, never whole in memory
(a sharded save: :mod:`.sharded`, rank 0).

The file is the pickle an unsharded ``Trainer.save_states`` writes (MXNet 1.9.1
``Updater.get_states``: ``(states, optimizer)``, each state array an ``NDArray``), at
protocol 3, so ``Trainer.load_states`` and ``pickle.load`` read it unchanged. Its skeleton
is pickled first with a small stand-in for each array (:class:`ArraySpace`), and copied to
the file with each stand-in's bytes replaced by the array's: MXNet's header
(:func:`~.gluon_internals.raw_array_header`), then room for its data, left to be written
at :attr:`ArraySpace.offset` as the data arrives, in any order (:func:`write_at`).
"""
from __future__ import annotations

import io
import os
import pickle
import struct
from typing import BinaryIO, List, Sequence, Tuple

import mxnet as mx
import numpy as np

from .gluon_internals import raw_array_header

_MARK = b"hvdtrain-arr"  # 12 bytes, then a 4-byte count: 16, a SHORT_BINBYTES of its own


class ArraySpace:
    """A state array to be written into the file later: its shape, dtype and, once the
    skeleton is written, the file offset of its data."""

    def __init__(self, shape: Sequence[int], dtype):
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        self.offset = -1

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


def write_skeleton(out: BinaryIO, states: dict, optimizer) -> None:
    """Write ``(states, optimizer)`` pickled, each :class:`ArraySpace` in `states` as an
    NDArray whose data is left to be written (its offset set). ValueError for an array of
    4 GiB or more (protocol 3's length field)."""
    spaces: List[Tuple[bytes, ArraySpace]] = []

    class _Pickler(pickle.Pickler):
        def reducer_override(self, obj):  # pylint: disable=missing-function-docstring
            if not isinstance(obj, ArraySpace):
                return NotImplemented
            marker = _MARK + struct.pack("<I", len(spaces))
            spaces.append((marker, obj))
            return (mx.nd.NDArray, (None,), {"handle": bytearray(marker)})

    skeleton = io.BytesIO()
    _Pickler(skeleton, protocol=3).dump((states, optimizer))
    small, done = skeleton.getvalue(), 0
    for marker, space in spaces:
        at = small.index(b"C\x10" + marker, done)  # SHORT_BINBYTES of 16 bytes
        header = raw_array_header(space.shape, space.dtype)
        if len(header) + space.nbytes >= 2 ** 32:
            raise ValueError(f"an optimizer state array of {space.nbytes} bytes is too "
                             f"large to be streamed")
        out.write(small[done:at])
        out.write(b"B" + struct.pack("<I", len(header) + space.nbytes) + header)
        space.offset = out.tell()
        out.seek(space.nbytes, io.SEEK_CUR)
        done = at + 2 + len(marker)
    out.write(small[done:])
    out.flush()


def write_at(out: BinaryIO, space: ArraySpace, start: int, values: np.ndarray) -> None:
    """Write `values` as the elements of `space`'s array from `start` (flat) on."""
    out.seek(space.offset + start * space.dtype.itemsize)
    out.write(np.ascontiguousarray(values, dtype=space.dtype).tobytes())


class GuardedFile:
    """The file a rank streams into while the other ranks wait for it in collectives: its
    first failure (a full disk, a state too large) is kept, not raised, so that the rank
    goes on with them; :class:`WrittenStates` raises it where a write's failure is handled
    (every rank alike: the save's own agreement)."""

    def __init__(self, path: str):
        self.path, self.error, self._file = path, None, None
        self.run(lambda: setattr(self, "_file", open(path, "wb+")))  # noqa: SIM115

    def run(self, action):
        """`action()`, unless something failed already; its failure kept."""
        if self.error is None:
            try:
                return action()
            except (OSError, ValueError) as err:
                self.error = err
        return None

    def write(self, data) -> None:
        self.run(lambda: self._file.write(data))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> None:
        self.run(lambda: self._file.seek(offset, whence))

    def tell(self) -> int:
        return self.run(lambda: self._file.tell()) or 0

    def flush(self) -> None:
        self.run(lambda: self._file.flush())

    def close(self) -> "WrittenStates":
        """Close the file; what it holds, or its failure."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError as err:
                self.error = self.error or err
        return WrittenStates(self.path, self.error)


class WrittenStates:
    """A states file written already (:func:`write_skeleton` and the data), or the failure
    that stopped its writing: called, its bytes (as a ``StatesLater``); :meth:`move_to`
    puts the file itself in place."""

    def __init__(self, path: str, error: Exception = None):
        self.path, self.error = path, error

    def __call__(self) -> bytes:
        self._check()
        with open(self.path, "rb") as src:
            return src.read()

    def move_to(self, path: str) -> None:
        """Rename the file to `path` (the same file system: it is written beside)."""
        self._check()
        os.replace(self.path, path)

    def _check(self) -> None:
        if self.error is not None:
            if os.path.exists(self.path):
                os.remove(self.path)
            raise OSError(f"the optimizer state could not be written to {self.path}: "
                          f"{self.error}") from self.error

