"""Image datasets streamed from disk: a folder of class folders, or MXNet RecordIO.

Layouts (``--data-dir DIR``)::

    imagefolder   DIR/train/<class>/*.jpg|jpeg|png   DIR/val/<class>/*
    recordio      DIR/train.rec + DIR/train.idx      DIR/val.rec + DIR/val.idx

Only the index is held in memory (compactly: a folder's file names as one bytes buffer, a
``.idx`` as one int64 array of offsets), never the images: a rank reads the samples its
sampler gives it, by position, when the loader asks for them. Layout errors are found here,
before training, as :class:`~hvdtrain.data.datasets.DatasetError` (one line, exit 2).
"""
from __future__ import annotations

import hashlib
import os
import struct
from collections import Counter
from typing import List, Optional, Tuple

import numpy as np

from .errors import BadSample, DatasetError
from .paths import check_folder, class_names, entry_is, scan

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
SPLITS = ("train", "val")
RECORD_MAGIC = 0xCED7230A
RECORD_HEAD = struct.Struct("<II")  # magic, (continuation flag << 29) | length


def record_head(head: bytes) -> Tuple[int, int, int]:
    """(magic, continuation flag, payload length) of a record's 8-byte head."""
    magic, word = RECORD_HEAD.unpack_from(head)
    return magic, word >> 29, word & ((1 << 29) - 1)
IR_HEADER = struct.Struct("<IfQQ")  # MXNet's IRHeader: flag, label, id, id2


class FolderSplit:
    """One split of an image folder: file names per class, held as one bytes buffer.

    Sample ``i`` is the i-th file in (class name, file name) order; its label is the index
    of its class in `classes` (the sorted class names of ``train/``).
    """

    def __init__(self, root: str, classes: List[str]):
        self.root = root
        names, labels = [], []
        for label, name in enumerate(classes):
            folder = os.path.join(root, name)
            files = sorted(e.name for e in scan(folder) if
                           e.name.lower().endswith(IMAGE_EXTENSIONS) and entry_is(e, "file"))
            if not files:
                raise DatasetError(f"class folder {folder} holds no .jpg/.jpeg/.png image: "
                                   f"add its images or remove the folder (from train/ and "
                                   f"val/ alike)")
            names.extend(os.path.join(name, f) for f in files)
            labels.append(np.full(len(files), label, np.int32))
        blob = "\n".join(names).encode("utf-8", "surrogateescape")
        self._blob = blob
        ends = np.flatnonzero(np.frombuffer(blob, np.uint8) == ord("\n"))
        self._starts = np.concatenate([[0], ends + 1]).astype(np.int64)
        self._ends = np.concatenate([ends, [len(blob)]]).astype(np.int64)
        self.labels = np.concatenate(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def name(self, index: int) -> str:
        """The sample's file, relative to the split's folder."""
        raw = self._blob[self._starts[index]:self._ends[index]]
        return raw.decode("utf-8", "surrogateescape")

    def describe(self, index: int) -> str:
        return os.path.join(self.root, self.name(index))

    def read(self, index: int) -> Tuple[bytes, int]:
        """The encoded image and label of sample `index`."""
        path = self.describe(index)
        try:
            with open(path, "rb") as src:
                return src.read(), int(self.labels[index])
        except OSError as err:
            raise BadSample(f"{path}: {err.strerror}") from None

    def fingerprint(self) -> str:
        """A checksum of the file list and labels: equal on hosts holding the same set."""
        return hashlib.sha256(self._blob + self.labels.tobytes()).hexdigest()[:16]


class RecordSplit:
    """One split of a RecordIO pack: ``.rec`` records found through the ``.idx`` offsets.

    Sample ``i`` is the record with the i-th smallest key. Reads use ``os.pread``, so the
    loader's threads share one file descriptor without seeking.
    """

    def __init__(self, rec_path: str, idx_path: str):
        self.root = rec_path
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
        """The encoded image and label of sample `index` (first label of a label array)."""
        raw = self._raw(index)
        if len(raw) < IR_HEADER.size:
            raise BadSample(f"{self.describe(index)}: record shorter than its header")
        flag, label, _, _ = IR_HEADER.unpack_from(raw)
        start = IR_HEADER.size
        if flag > 0:
            label = struct.unpack_from("<f", raw, start)[0]
            start += 4 * flag
        return raw[start:], int(label)

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


def open_folder(data_dir: str) -> Tuple[List[str], FolderSplit, FolderSplit]:
    """Class names and the train and val splits of an image folder (refused in one line
    when the layout is not ``train/<class>/*``, ``val/<class>/*`` with equal class sets)."""
    splits = {}
    for split in SPLITS:
        folder = os.path.join(data_dir, split)
        check_folder(folder, f"an image folder needs {folder}/<class>/*.jpg:")
        splits[split] = class_names(folder)
    classes = splits["train"]
    if not classes:
        raise DatasetError(f"{os.path.join(data_dir, 'train')} holds no class folder: put "
                           f"each class's images in train/<class>/")
    if splits["val"] != classes:
        only_train = sorted(set(classes) - set(splits["val"]))
        only_val = sorted(set(splits["val"]) - set(classes))
        raise DatasetError(f"the class folders of {data_dir}/train and {data_dir}/val differ "
                           f"(only in train: {_few(only_train)}; only in val: "
                           f"{_few(only_val)}): give both splits the same classes")
    return (classes, FolderSplit(os.path.join(data_dir, "train"), classes),
            FolderSplit(os.path.join(data_dir, "val"), classes))


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


def _few(names: List[str], limit: int = 3) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def record_classes(data_dir: str) -> Optional[List[str]]:
    """Class names saved beside a pack by hvdtrain-pack (``classes.txt``), if any."""
    path = os.path.join(data_dir, "classes.txt")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as src:
        names = [line.rstrip("\n") for line in src if line.strip()]
    if not names:
        raise DatasetError(f"{path} is empty: it must name the classes, one a line in label "
                           f"order (re-pack with hvdtrain-pack, or remove it to number them)")
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise DatasetError(f"{path} names {', '.join(repeated[:3])} more than once: each "
                           f"label needs a class name of its own")
    return names
