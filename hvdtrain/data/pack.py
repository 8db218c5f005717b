"""``hvdtrain-pack``: pack an image folder into MXNet RecordIO, as ``--dataset recordio`` reads.

    hvdtrain-pack IMAGES_DIR PACK_DIR

reads ``IMAGES_DIR/train/<class>/*`` and ``IMAGES_DIR/val/<class>/*`` and writes
``PACK_DIR/{train,val}.{rec,idx}`` with MXNet's own writer (``mxnet.recordio``: the image
bytes as they are, not re-encoded, so no OpenCV is needed) and ``PACK_DIR/classes.txt``
(the class names, one a line, in label order). Record keys count from 0 in (class, file)
order, the order ``--dataset imagefolder`` numbers the same samples in, so both formats
train on the same sample order.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from .datasets import DatasetError
from .images import SPLITS, open_folder


def pack_split(split, prefix: str) -> int:
    """Write `split` (an images.FolderSplit) to ``prefix.rec`` + ``prefix.idx``."""
    import mxnet as mx  # the writer of the format is MXNet's own
    writer = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    try:
        for index in range(len(split)):
            encoded, label = split.read(index)
            header = mx.recordio.IRHeader(0, float(label), index, 0)
            writer.write_idx(index, mx.recordio.pack(header, encoded))
    finally:
        writer.close()
    return len(split)


def pack_folder(images_dir: str, pack_dir: str) -> List[int]:
    """Pack both splits of `images_dir` into `pack_dir`; return their sample counts."""
    classes, train, val = open_folder(images_dir)
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
    try:
        counts = pack_folder(args.images_dir, args.pack_dir)
    except (DatasetError, OSError) as err:
        text = getattr(err, "strerror", None) or str(err)
        print(f"hvdtrain-pack: error: {text}", file=sys.stderr)
        return 2
    print(f"packed {counts[0]} train and {counts[1]} val images into {args.pack_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
