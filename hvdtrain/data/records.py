"""One split of an MXNet RecordIO pack (``.rec`` + ``.idx``), read record by record.

Only the ``.idx`` is held in memory (one int64 array of offsets: 16 bytes a record), never
the images: a rank reads the records its sampler gives it, by position, with ``os.pread``.
What is wrong with the files is refused at open as
:class:`~hvdtrain.data.errors.DatasetError` (one line, exit 2); what is wrong with one
record, when it is read, as :class:`~hvdtrain.data.errors.BadSample`.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
from typing import Optional, Tuple

import numpy as np

from .errors import BadSample, DatasetError, UnusableLabel

SPLITS = ("train", "val")
RECORD_MAGIC = 0xCED7230A
RECORD_HEAD = struct.Struct("<II")  # magic, (continuation flag << 29) | length
IR_HEADER = struct.Struct("<IfQQ")  # MXNet's IRHeader: flag, label, id, id2


def record_head(head: bytes) -> Tuple[int, int, int]:
    """(magic, continuation flag, payload length) of a record's 8-byte head."""
    magic, word = RECORD_HEAD.unpack_from(head)
    return magic, word >> 29, word & ((1 << 29) - 1)


class RecordSplit:
    """One split of a RecordIO pack: ``.rec`` records found through the ``.idx`` offsets.

    Sample ``i`` is the record with the i-th smallest key. Reads use ``os.pread``, so the
    loader's threads share one file descriptor without seeking.
    """

    def __init__(self, rec_path: str, idx_path: str):
        self.root = rec_path
        # The number of classes, once the class names are decided (pack_labels); a label
        # outside 0..num_classes-1 is then a bad sample, never a target for the loss.
        self.num_classes: Optional[int] = None
        self.keys, self.offsets = read_idx(idx_path)
        self.index_path = idx_path
        self._size = os.path.getsize(rec_path)
        self.fd = os.open(rec_path, os.O_RDONLY)
        # A copy cut short (a full disk, an interrupted rsync) is found now, not as one
        # skipped sample after another for the whole tail of every epoch: the last record
        # (its head, and the length the head gives) must end inside the file.
        last = int(self.offsets.max())
        head = os.pread(self.fd, RECORD_HEAD.size, last)
        end = last + RECORD_HEAD.size
        if len(head) == RECORD_HEAD.size and record_head(head)[0] == RECORD_MAGIC:
            end += record_head(head)[2]  # else: one damaged record
        if end > self._size:
            os.close(self.fd)
            raise DatasetError(f"{rec_path} is truncated: {idx_path} has a record at offset "
                               f"{last} ending at byte {end} but the file holds "
                               f"{self._size} bytes; copy the pack again or re-pack it "
                               f"(hvdtrain-pack)")

    def __len__(self) -> int:
        return len(self.offsets)

    def describe(self, index: int) -> str:
        return f"{self.root} record {int(self.keys[index])}"

    def _raw(self, index: int) -> bytes:
        offset, parts = int(self.offsets[index]), []
        while True:
            head = os.pread(self.fd, RECORD_HEAD.size, offset)
            if len(head) < RECORD_HEAD.size:
                raise BadSample(f"{self.describe(index)}: truncated at offset {offset}")
            magic, flag, length = record_head(head)
            if magic != RECORD_MAGIC or offset + RECORD_HEAD.size + length > self._size:
                raise BadSample(f"{self.describe(index)}: no record at offset {offset} "
                                f"(damaged pack, or .idx not made for this .rec)")
            parts.append(os.pread(self.fd, length, offset + RECORD_HEAD.size))
            # dmlc splits a record where its payload holds the magic number (flags 1, 2, 3).
            if flag in (0, 3):
                break
            offset += RECORD_HEAD.size + length + (-length % 4)
        return struct.pack("<I", RECORD_MAGIC).join(parts)

    def read(self, index: int) -> Tuple[bytes, int]:
        """The encoded image and class of sample `index` (raises :class:`BadSample`)."""
        try:
            raw = self._raw(index)
        except OSError as err:  # an I/O error on one record costs that sample, as a file's
            raise BadSample(f"{self.describe(index)}: cannot read ({err.strerror or err})") \
                from None
        if len(raw) < IR_HEADER.size:
            raise BadSample(f"{self.describe(index)}: record shorter than its header")
        flag, value, _, _ = IR_HEADER.unpack_from(raw)
        start = IR_HEADER.size + 4 * flag
        if len(raw) < start:
            raise BadSample(f"{self.describe(index)}: record shorter than its {flag} labels")
        if flag > 0:
            value = struct.unpack_from("<f", raw, IR_HEADER.size)[0]
        return raw[start:], self.class_of(index, flag, value)

    def class_of(self, index: int, flag: int, value: float) -> int:
        """The class number of record `index` from its header: `flag` (how many labels
        follow the header: MXNet's IRHeader) and its label `value` (the first one).

        A label array of one value (``mx.recordio.pack`` given a list) is that value. More
        than one is a multi-label record, which ImageRecordIter refuses too (label_width
        1); taking its first label would train on a guess."""
        what = self.describe(index)
        if flag > 1:
            raise UnusableLabel(f"{what} holds {flag} labels (a multi-label pack): hvdtrain "
                                f"trains one class an image; pack one label a record "
                                f"(im2rec without --pack-label)")
        if not (math.isfinite(value) and value == int(value)):
            raise UnusableLabel(f"{what} has label {value}, not a class number: pack "
                                f"whole class numbers 0, 1, 2, ...")
        label = int(value)
        if self.num_classes is not None and not 0 <= label < self.num_classes:
            raise BadSample(f"{what}: label {label} is not one of the {self.num_classes} "
                            f"classes (0-{self.num_classes - 1})")
        return label

    def fingerprint(self) -> str:
        with open(self.index_path, "rb") as src:
            return hashlib.sha256(src.read()).hexdigest()[:16]

    def close(self) -> None:
        os.close(self.fd)


def read_idx(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """Keys and offsets of a ``.idx`` file (``key<TAB>offset`` lines), sorted by key.

    Parsed a block of lines at a time into int64 arrays, so that a large index costs 16
    bytes a record rather than a Python dict's hundred.
    """
    chunks = []
    if not _ends_with_newline(path):
        # MXIndexedRecordIO (im2rec, hvdtrain-pack) ends every line with a newline: a file
        # that does not was cut short, and its last offset may be a cut number.
        raise DatasetError(f"{path} ends inside a line (cut short?): its last offset cannot "
                           f"be trusted; copy the pack again or make the index again with "
                           f"im2rec or hvdtrain-pack")
    try:
        with open(path, "rb") as src:
            while True:
                block = src.read(1 << 22) + src.readline()
                if not block:
                    break
                chunks.append(np.array(block.split(), dtype=np.int64).reshape(-1, 2))
    except OSError as err:
        raise DatasetError(f"cannot read {path}: {err.strerror}") from None
    except ValueError:
        raise DatasetError(f"{path} is not a RecordIO index (lines of 'key<TAB>offset'): "
                           f"make it again with im2rec or hvdtrain-pack") from None
    table = np.concatenate(chunks) if chunks else np.zeros((0, 2), np.int64)
    if not len(table):
        raise DatasetError(f"{path} is empty: the pack holds no record")
    table = table[np.argsort(table[:, 0], kind="stable")]
    return table[:, 0].copy(), table[:, 1].copy()


def _ends_with_newline(path: str) -> bool:
    """Whether `path` ends with a newline; True for an empty or unreadable file (refused
    elsewhere, each with its own message)."""
    try:
        with open(path, "rb") as src:
            if src.seek(0, os.SEEK_END) == 0:
                return True
            src.seek(-1, os.SEEK_END)
            return src.read(1) == b"\n"
    except OSError:
        return True


def open_records(data_dir: str) -> Tuple[RecordSplit, RecordSplit]:
    """The train and val splits of a RecordIO pack (refused in one line when a file is
    missing or unreadable)."""
    out = []
    for split in SPLITS:
        rec, idx = (os.path.join(data_dir, f"{split}.{ext}") for ext in ("rec", "idx"))
        if not os.path.isfile(rec):
            raise DatasetError(f"--dataset recordio needs {rec} (and {idx}): not found; pack "
                               f"a folder with hvdtrain-pack (see docs/data.md)")
        if not os.path.isfile(idx):
            raise DatasetError(f"{rec} has no index {idx} beside it: make it with "
                               f"hvdtrain-pack or im2rec (RecordIO needs the .idx for "
                               f"random access)")
        if not os.access(rec, os.R_OK):
            raise DatasetError(f"cannot read {rec}: permission denied")
        out.append(RecordSplit(rec, idx))
    return out[0], out[1]
