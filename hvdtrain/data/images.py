"""Image datasets streamed from disk: a folder of class folders, or MXNet RecordIO.

Layouts (``--data-dir DIR``)::

    imagefolder   DIR/train/<class>/**/*.jpg|png|...   DIR/val/<class>/**/*
    recordio      DIR/train.rec + DIR/train.idx        DIR/val.rec + DIR/val.idx

Only the index is held in memory (compactly: a folder's file names as one bytes buffer, a
``.idx`` as one int64 array of offsets: :mod:`.records`), never the images: a rank reads the
samples its sampler gives it, by position, when the loader asks for them. Layout errors are
found here, before training, as :class:`~hvdtrain.data.errors.DatasetError` (one line,
exit 2).
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from typing import List, Tuple

import numpy as np

from .errors import BadSample, DatasetError, UnusableLabel  # noqa: F401  (re-exported)
from .paths import check_folder, class_names, image_files
# The RecordIO split, re-exported: ``images`` is where both formats are opened.
from .records import (IR_HEADER, RECORD_HEAD, RECORD_MAGIC, SPLITS, RecordSplit,  # noqa: F401
                      open_records, read_idx, record_head)

logger = logging.getLogger("hvdtrain")

# torchvision's ImageFolder's list: every one decodes with Pillow (MXNet's own decoder,
# ImageRecordIter's, reads neither WebP nor PPM/PGM: docs/data.md).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
EXTENSION_LIST = "/".join(IMAGE_EXTENSIONS)


class FolderSplit:
    """One split of an image folder: file names per class, held as one bytes buffer.

    Sample ``i`` is the i-th image in (class name, path within the class folder) order, its
    label the index of its class in `classes` (the sorted class names of ``train/``). A
    class's images are those below its folder at any depth (:func:`paths.image_files`).
    ``left_out`` counts the other files found there, by extension.
    """

    def __init__(self, root: str, classes: List[str]):
        self.root = root
        names, labels, self.left_out = [], [], Counter()
        for label, name in enumerate(classes):
            folder = os.path.join(root, name)
            files, left_out = image_files(folder, IMAGE_EXTENSIONS)
            if not files:
                raise DatasetError(f"class folder {folder} holds no image ({EXTENSION_LIST}, "
                                   f"at any depth): add its images or remove the folder "
                                   f"(from train/ and val/ alike)")
            names.extend(os.path.join(name, f) for f in files)
            labels.append(np.full(len(files), label, np.int32))
            self.left_out.update(left_out)
        # NUL separates the names: the one byte a POSIX file name cannot hold (a newline
        # can: as a separator it gave such a file two samples and shifted later labels).
        blob = "\0".join(names).encode("utf-8", "surrogateescape")
        self._blob = blob
        ends = np.flatnonzero(np.frombuffer(blob, np.uint8) == 0)
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
    train, val = (FolderSplit(os.path.join(data_dir, split), classes) for split in SPLITS)
    for split in (train, val):
        _note_left_out(split)
    return classes, train, val


def _note_left_out(split: FolderSplit) -> None:
    """Warn once for a split whose class folders hold files that are not images by their
    extension (a .gif, a .heic, a notes.txt): left out, but said, with the rule."""
    if not split.left_out:
        return
    kinds = [f"{count} {ext or 'without extension'}"
             for ext, count in sorted(split.left_out.items(), key=lambda k: (-k[1], k[0]))]
    logger.warning("left out %d file(s) of %s that are not images by their extension "
                   "(%s): a class takes the %s files below its folder, at any depth",
                   sum(split.left_out.values()), split.root, _few(kinds), EXTENSION_LIST)


def _few(names: List[str], limit: int = 3) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
