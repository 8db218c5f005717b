"""The class names of a RecordIO pack, and the check that they fit the labels it holds.

A pack's records carry only label numbers; the names come from beside it (``classes.txt``,
or im2rec's ``train.lst``). A list that does not match the records (a stale ``classes.txt``
from another pack, a hand-written one with a class missing, a ``train.lst`` of another
pack) would size the model's output wrongly and train without a word, so it is checked
against the labels before training. Records are sampled there (:data:`LABELS_CHECKED`);
each split then knows its number of classes (``RecordSplit.num_classes``), so a record
whose label lies outside them, met later, is skipped and counted, never fed to the loss.
"""
from __future__ import annotations

import logging
import os
import struct
from collections import Counter
from typing import Dict, List, Optional, Set

import numpy as np

from .errors import BadSample, DatasetError, UnusableLabel
from .records import IR_HEADER, RECORD_HEAD, RECORD_MAGIC, RecordSplit, record_head

logger = logging.getLogger("hvdtrain")

# Records whose labels are read at open, per split, spread evenly over the pack: all of a
# small pack; on ImageNet a few reads of 36 bytes, not a pass over 140 GB.
LABELS_CHECKED = 2000
RELIST = "the class list is not this pack's; re-pack with hvdtrain-pack or fix the list"


def record_class_names(data_dir: str, train: RecordSplit, test: RecordSplit) -> List[str]:
    """Class names of a pack: ``classes.txt`` beside it (hvdtrain-pack writes it), else
    ``train.lst`` (im2rec's list: ``index<TAB>label<TAB>path``), else the labels of the
    records themselves, read header by header (slow on a large pack on a network disk).
    Refused in one line when the names do not fit the labels found. Sets both splits'
    ``num_classes``."""
    names = record_classes(data_dir)
    listing = os.path.join(data_dir, "train.lst")
    listed = _listing_labels(listing) if os.path.isfile(listing) else None
    fix, every_class = RELIST, True
    if names:
        source = os.path.join(data_dir, "classes.txt")
        if listed and max(listed) + 1 != len(names):
            raise DatasetError(f"{source} names {len(names)} classes but {listing} has labels "
                               f"0-{max(listed)}: make them agree (re-pack with hvdtrain-pack)")
        claim = f"{source} names {len(names)} classes (labels 0-{len(names) - 1})"
    elif listed:
        names = [str(i) for i in range(max(listed) + 1)]
        claim = f"{listing} has labels 0-{max(listed)}"
    else:
        logger.warning("%s has no classes.txt or train.lst beside it: reading every "
                       "record's label to count the classes", data_dir)
        found = read_labels(train, np.arange(len(train)))
        if not found:
            raise DatasetError(f"{train.root} holds no readable record: copy the pack again "
                               f"or re-pack it")
        names = [str(i) for i in range(max(found) + 1)]
        claim = f"the records of {train.root} have labels up to {len(names) - 1}"
        fix = ("labels count from 0, and the validation records' must be training labels; "
               "re-pack both splits from one folder (hvdtrain-pack)")
        every_class = False  # counted from the records: no list to disagree with them
    if listed:
        _check_listed(listing, listed)
    check_labels(train, len(names), claim, fix, every_class=every_class)
    check_labels(test, len(names), claim, fix, every_class=False)
    train.num_classes = test.num_classes = len(names)
    return names


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


def _listing_labels(listing: str) -> Set[int]:
    """The labels of im2rec's list (read whole: a line of text per image), refused in one
    line when a line is not ``index<TAB>label<TAB>path`` with a class number as label."""
    labels = set()
    with open(listing, encoding="utf-8", errors="surrogateescape") as src:
        for number, line in enumerate(src, 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            try:
                value = float(fields[1]) if len(fields) >= 3 else None
            except ValueError:
                value = None
            if value is None or not (value >= 0 and value == int(value)):
                raise DatasetError(f"line {number} of {listing} is not 'index<TAB>label"
                                   f"<TAB>path' with a class number 0, 1, 2, ... as label: "
                                   f"make the list again with im2rec --list")
            labels.add(int(value))
    if not labels:
        raise DatasetError(f"{listing} is empty: make the list again with im2rec --list, "
                           f"or remove it")
    return labels


def _check_listed(listing: str, labels: Set[int]) -> None:
    """Refuse a list in which a label below the largest has no image: an output that would
    never train (a list of 9 labels numbered up to 9 made a model of 10 classes)."""
    missing = sorted(set(range(max(labels) + 1)) - labels)
    if missing:
        raise DatasetError(f"{listing} has labels 0-{max(labels)} but no image of label(s) "
                           f"{_some(missing)}: each class needs images; make the list again "
                           f"with im2rec --list")


def read_labels(split: RecordSplit, positions: np.ndarray) -> Dict[int, int]:
    """{label: first position holding it} over the records at `positions` (read in file
    order). A damaged record is passed over, as training skips it; refused in one line when
    more than half of them are not records at all (the index was not made for this file),
    or when a record's label is not one class number (a multi-label pack)."""
    found, damaged = {}, 0
    for position in positions[np.argsort(split.offsets[positions])]:
        try:
            found.setdefault(label(split, int(position)), int(position))
        except UnusableLabel as err:
            raise DatasetError(str(err)) from None
        except BadSample:
            damaged += 1
    if damaged * 2 > len(positions):
        raise DatasetError(f"{split.root} does not match its index {split.index_path}: "
                           f"{damaged} of the {len(positions)} records read at the index's "
                           f"offsets are not records there (an .idx made for another .rec, "
                           f"or a damaged pack); copy the pack again or re-pack it")
    return found


def check_labels(split: RecordSplit, num_classes: int, claim: str, fix: str,
                 every_class: bool) -> None:
    """Refuse `split` when a record's label is not one of `num_classes` (`claim` says whose
    count it is, `fix` what to do), or, with `every_class` when every record was read, when
    a class has no record (as an empty class folder is refused)."""
    count = len(split)
    positions = np.unique(np.linspace(0, count - 1, min(count, LABELS_CHECKED)).astype(int))
    found = read_labels(split, positions)
    outside = sorted(l for l in found if not 0 <= l < num_classes)
    if outside:
        raise DatasetError(f"{claim} but {split.describe(found[outside[-1]])} has label "
                           f"{outside[-1]}: {fix}")
    if every_class and len(positions) == count and len(found) < num_classes:
        missing = sorted(set(range(num_classes)) - set(found))
        raise DatasetError(f"{claim} but {split.root} has no record of label(s) "
                           f"{_some(missing)}: {fix}")


def _some(numbers: List[int], limit: int = 5) -> str:
    return ", ".join(map(str, numbers[:limit])) + (" ..." if len(numbers) > limit else "")


def label(split: RecordSplit, index: int) -> int:
    """The class of record `index`, from its header alone where it can (raises
    :class:`BadSample`, :class:`UnusableLabel` for a label array or a fraction)."""
    offset = int(split.offsets[index])
    try:
        head = os.pread(split.fd, RECORD_HEAD.size + IR_HEADER.size + 4, offset)
    except OSError as err:
        raise BadSample(f"{split.describe(index)}: cannot read ({err.strerror})") from None
    if len(head) == RECORD_HEAD.size + IR_HEADER.size + 4:
        magic, _, length = record_head(head)
        if magic == RECORD_MAGIC and length >= IR_HEADER.size + 4:
            flag, value, _, _ = IR_HEADER.unpack_from(head, RECORD_HEAD.size)
            if length >= IR_HEADER.size + 4 * flag:
                if flag > 0:
                    value = struct.unpack_from("<f", head, RECORD_HEAD.size + IR_HEADER.size)[0]
                return split.class_of(index, flag, value)
    return split.read(index)[1]  # a split, short or damaged record: read it whole
