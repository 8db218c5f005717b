"""The class names of a RecordIO pack, and the check that they fit the labels it holds.

A pack's records carry only label numbers; the names come from beside it (``classes.txt``,
or im2rec's ``train.lst``). A list that does not match the records (a stale ``classes.txt``
from another pack, a hand-written one with a class missing) would size the model's output
wrongly and train without a word, so it is checked against the labels before training.
"""
from __future__ import annotations

import logging
import os
import struct
from typing import Dict, List, Optional

import numpy as np

from .errors import BadSample, DatasetError
from .images import (IR_HEADER, RECORD_HEAD, RECORD_MAGIC, RecordSplit,
                     record_classes, record_head)

logger = logging.getLogger("hvdtrain")

# Records whose labels are read at open, per split, spread evenly over the pack: all of a
# small pack; on ImageNet a few reads of 36 bytes, not a pass over 140 GB.
LABELS_CHECKED = 2000


def record_class_names(data_dir: str, train: RecordSplit, test: RecordSplit) -> List[str]:
    """Class names of a pack: ``classes.txt`` beside it (hvdtrain-pack writes it), else
    ``train.lst`` (im2rec's list: ``index<TAB>label<TAB>path``), else the labels of the
    records themselves, read header by header (slow on a large pack on a network disk).
    Refused in one line when the names do not fit the labels found."""
    names = record_classes(data_dir)
    listing = os.path.join(data_dir, "train.lst")
    top = _listing_top(listing) if os.path.isfile(listing) else None
    if names:
        source = os.path.join(data_dir, "classes.txt")
        if top is not None and top + 1 != len(names):
            raise DatasetError(f"{source} names {len(names)} classes but {listing} has labels "
                               f"0-{top}: make them agree (re-pack with hvdtrain-pack)")
        check_labels(train, len(names), source, every_class=True)
        check_labels(test, len(names), source, every_class=False)
        return names
    if top is None:
        logger.warning("%s has no classes.txt or train.lst beside it: reading every "
                       "record's label to count the classes", data_dir)
        found = read_labels(train, np.arange(len(train)))
        if not found:
            raise DatasetError(f"{train.root} holds no readable record: copy the pack again "
                               f"or re-pack it")
        top = max(found)
    return [str(i) for i in range(top + 1)]


def read_labels(split: RecordSplit, positions: np.ndarray) -> Dict[int, int]:
    """{label: first position holding it} over the records at `positions` (read in file
    order). A damaged record is passed over, as training skips it; refused in one line when
    more than half of them are not records at all: the index was not made for this file."""
    found, damaged = {}, 0
    for position in positions[np.argsort(split.offsets[positions])]:
        try:
            found.setdefault(label(split, int(position)), int(position))
        except BadSample:
            damaged += 1
    if damaged * 2 > len(positions):
        raise DatasetError(f"{split.root} does not match its index {split.index_path}: "
                           f"{damaged} of the {len(positions)} records read at the index's "
                           f"offsets are not records there (an .idx made for another .rec, "
                           f"or a damaged pack); copy the pack again or re-pack it")
    return found


def _listing_top(listing: str) -> int:
    with open(listing, encoding="utf-8") as src:
        return max(int(float(line.split("\t")[1])) for line in src if line.strip())


def check_labels(split: RecordSplit, num_classes: int, source: str, every_class: bool) -> None:
    """Refuse `split` when a record's label is not a class of `source`'s list, or, with
    `every_class` when every record was read, when the list names classes no record has
    (as an empty class folder is refused)."""
    count = len(split)
    positions = np.unique(np.linspace(0, count - 1, min(count, LABELS_CHECKED)).astype(int))
    found = read_labels(split, positions)
    outside = sorted(l for l in found if not 0 <= l < num_classes)
    if outside:
        raise DatasetError(f"{source} names {num_classes} classes (labels 0-"
                           f"{num_classes - 1}) but {split.describe(found[outside[-1]])} has "
                           f"label {outside[-1]}: the class list is not this pack's; "
                           f"re-pack with hvdtrain-pack or fix the list")
    if every_class and len(positions) == count and len(found) < num_classes:
        missing = sorted(set(range(num_classes)) - set(found))
        raise DatasetError(f"{source} names {num_classes} classes but {split.root} has no "
                           f"record of label(s) {', '.join(map(str, missing[:5]))}"
                           f"{' ...' if len(missing) > 5 else ''}: the class list is not "
                           f"this pack's; re-pack with hvdtrain-pack or fix the list")


def label(split: RecordSplit, index: int) -> int:
    """The (first) label of record `index`, from its header alone."""
    offset = int(split.offsets[index])
    head = os.pread(split.fd, RECORD_HEAD.size + IR_HEADER.size + 4, offset)
    if len(head) == RECORD_HEAD.size + IR_HEADER.size + 4:
        magic, _, length = record_head(head)
        if magic == RECORD_MAGIC and length >= IR_HEADER.size + 4:
            flag, value, _, _ = IR_HEADER.unpack_from(head, RECORD_HEAD.size)
            if flag > 0:
                value = struct.unpack_from("<f", head, RECORD_HEAD.size + IR_HEADER.size)[0]
            return int(value)
    return split.read(index)[1]  # a split or short record: read it whole
