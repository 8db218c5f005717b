"""``hvdtrain-pack``: pack an image folder into MXNet RecordIO, as ``--dataset recordio`` reads.

    hvdtrain-pack IMAGES_DIR PACK_DIR

reads ``IMAGES_DIR/train/<class>/**`` and ``IMAGES_DIR/val/<class>/**`` (the images of
``--dataset imagefolder``: :mod:`hvdtrain.data.images`) and writes
``PACK_DIR/{train,val}.{rec,idx}`` with MXNet's own writer (``mxnet.recordio``: the image
bytes as they are, not re-encoded, so no OpenCV is needed) and ``PACK_DIR/classes.txt``
(the class names, one a line, in label order). Record keys count from 0 in (class, file)
order, the order ``--dataset imagefolder`` numbers the same samples in, so both formats
train on the same sample order.

Each image is decoded first (at 1/8 scale for a JPEG: cheap) with the decoder training uses;
one that cannot be decoded is left out with a warning naming it and counted in the summary
line, as im2rec skips what it cannot read: a pack then holds only images that train, and its
record keys keep the folder's numbers (the skipped key is missing).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional, Tuple

from .errors import BadSample, DatasetError
from .images import SPLITS, open_folder
from .paths import check_folder
from .transforms import decodes

logger = logging.getLogger("hvdtrain")


def pack_split(split, prefix: str) -> Tuple[int, int]:
    """Write `split` (an images.FolderSplit) to ``prefix.rec`` + ``prefix.idx``; return
    (images packed, images skipped as unreadable or undecodable)."""
    import mxnet as mx  # the writer of the format is MXNet's own
    writer = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    skipped = 0
    try:
        for index in range(len(split)):
            try:
                encoded, label = split.read(index)
                decodes(encoded, split.describe(index))
            except BadSample as err:
                print(f"hvdtrain-pack: warning: skipped {err}", file=sys.stderr)
                skipped += 1
                continue
            header = mx.recordio.IRHeader(0, float(label), index, 0)
            writer.write_idx(index, mx.recordio.pack(header, encoded))
    finally:
        writer.close()
    return len(split) - skipped, skipped


def pack_folder(images_dir: str, pack_dir: str) -> List[Tuple[int, int]]:
    """Pack both splits of `images_dir` into `pack_dir`; return (packed, skipped) counts
    per split."""
    check_folder(images_dir, "IMAGES_DIR")
    if os.path.exists(pack_dir) and not os.path.isdir(pack_dir):
        raise DatasetError(f"PACK_DIR {pack_dir} is not a folder: give the folder to write "
                           f"the pack into (it is made if missing)")
    classes, train, val = open_folder(images_dir)
    for name in classes:
        if "\n" in name or "\r" in name:
            # classes.txt holds one name a line; a file name may hold a line break (the
            # folder's index handles it), a class name cannot.
            raise DatasetError(f"class folder {os.path.join(images_dir, 'train', name)!r} has "
                               f"a line break in its name, which classes.txt (one name a "
                               f"line) cannot hold: rename the folder in train/ and val/")
    os.makedirs(pack_dir, exist_ok=True)
    with open(os.path.join(pack_dir, "classes.txt"), "w", encoding="utf-8") as out:
        out.write("".join(name + "\n" for name in classes))
    return [pack_split(split, os.path.join(pack_dir, name))
            for name, split in zip(SPLITS, (train, val))]


def run(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hvdtrain-pack", description="Pack an image folder (train/<class>/*, "
        "val/<class>/*) into RecordIO (train.rec/.idx, val.rec/.idx, classes.txt).")
    parser.add_argument("images_dir")
    parser.add_argument("pack_dir")
    args = parser.parse_args(argv)
    # Warnings of the folder's reader (files left out) in this program's own words.
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter("hvdtrain-pack: warning: %(message)s"))
    logger.addHandler(said)
    try:
        counts = pack_folder(args.images_dir, args.pack_dir)
    except (DatasetError, OSError) as err:
        text = str(err)
        if isinstance(err, OSError) and err.strerror:  # e.g. PACK_DIR is a file
            text = f"{err.filename}: {err.strerror}" if err.filename else err.strerror
        print(f"hvdtrain-pack: error: {text}", file=sys.stderr)
        return 2
    finally:
        logger.removeHandler(said)
    (train, train_skipped), (val, val_skipped) = counts
    skipped = train_skipped + val_skipped
    print(f"packed {train} train and {val} val images into {args.pack_dir}"
          + (f"; skipped {skipped} that cannot be read or decoded ({train_skipped} train, "
             f"{val_skipped} val; each named in a warning)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(run())
