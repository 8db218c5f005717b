"""What ``hvdtrain-predict`` reads: image files, folders of them, and RecordIO packs.

Each argument is one of:

- a folder: every ``.jpg``, ``.jpeg`` and ``.png`` file below it (sub-folders too, as the
  image-folder dataset reads them), sorted by path;
- a ``.rec`` file with its ``.idx`` beside it (``hvdtrain-pack``, ``im2rec``): every record,
  in key order, as ``--dataset recordio`` reads them;
- any other file: one image, whatever its name.

A path that does not exist, a pack without its index and a set of arguments holding no image
at all are refused in one line; an image that cannot be read is the caller's to report.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

from ..config import ConfigError
from ..data.errors import BadSample
from ..data.images import IMAGE_EXTENSIONS, RecordSplit


class InputError(ConfigError):
    """IMAGES that cannot be read as a whole; the message names the path."""


@dataclass(frozen=True)
class Item:
    """One image: a file (`record` None) or record `record` of the pack at `path`."""

    path: str
    record: Optional[int] = None
    pack: Optional[RecordSplit] = None
    position: int = 0  # the record's position in the pack

    def describe(self) -> str:
        return self.path if self.record is None else f"{self.path} record {self.record}"

    def read(self) -> bytes:
        """The encoded image (raises BadSample)."""
        if self.pack is not None:
            return self.pack.read(self.position)[0]
        try:
            with open(self.path, "rb") as src:
                return src.read()
        except OSError as err:
            raise BadSample(f"{self.path}: {err.strerror}") from None


def collect(paths: List[str]) -> List[Item]:
    """The images `paths` name, in the order given (a folder's and a pack's sorted)."""
    items: List[Item] = []
    for path in paths:
        if not os.path.exists(path):
            raise InputError(f"IMAGES {path} does not exist")
        if os.path.isdir(path):
            items.extend(Item(found) for found in _images_below(path))
        elif path.endswith(".rec"):
            pack = _open_pack(path)
            items.extend(Item(path, int(key), pack, position)
                         for position, key in enumerate(pack.keys))
        else:
            items.append(Item(path))
    if not items:
        raise InputError(f"no image in {', '.join(paths)}: looked for "
                         f"{'/'.join(IMAGE_EXTENSIONS)} files (in sub-folders too) and .rec "
                         f"packs")
    return items


def _images_below(folder: str) -> List[str]:
    found = []

    def refuse(err: OSError):
        raise InputError(f"cannot read {err.filename}: {err.strerror}")
    for root, dirs, files in os.walk(folder, onerror=refuse):
        dirs.sort()
        found.extend(os.path.join(root, name) for name in files
                     if name.lower().endswith(IMAGE_EXTENSIONS))
    return sorted(found)


def _open_pack(rec: str) -> RecordSplit:
    idx = rec[:-len(".rec")] + ".idx"
    if not os.path.isfile(idx):
        raise InputError(f"{rec} has no index {idx} beside it: make it with hvdtrain-pack or "
                         f"im2rec (the records are found through it)")
    return RecordSplit(rec, idx)  # DatasetError (one line) for a truncated or foreign pack
