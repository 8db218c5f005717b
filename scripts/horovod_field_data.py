#!/usr/bin/env python3
"""Small generated data for the GluonCV scripts that scripts/run_horovod_scripts.py runs.

Usage: scripts/horovod_field_data.py OUT_DIR [--per-class 20] [--boxes 32]

Writes, deterministically, nothing downloaded:

- ``OUT_DIR/digits-rec/{train,val}.{rec,idx}`` (and ``classes.txt``): the bundled digits as
  10 classes of small colour images (:mod:`hvdtrain.data.sample_images`), packed with
  MXNet's own writer (``hvdtrain-pack``): what ``train_horovod.py --rec-train/--rec-val``
  reads (``ImageRecordDataset``). 20 per class: 160 train, 40 val.
- ``OUT_DIR/voc/VOC2007/``: a Pascal VOC layout (``JPEGImages/``, ``Annotations/*.xml``,
  ``ImageSets/Main/{trainval,test}.txt``) of ``--boxes`` images, 3/4 trainval, each with one
  to three filled boxes of two of VOC's classes ("car" a wide box, "person" a tall one) on
  noise: what ``train_ssd.py --dataset voc --dataset-root OUT_DIR`` reads
  (``gluoncv.data.VOCDetection``; the runner's patch points it at ``--dataset-root``).
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

CLASSES = ("car", "person")
OBJECT = """  <object><name>{name}</name><difficult>0</difficult>
    <bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox>
  </object>
"""


def write_digits(out_dir, per_class):
    from hvdtrain.data.pack import pack_folder
    from hvdtrain.data.sample_images import write_digit_images
    images = os.path.join(out_dir, "digits")
    write_digit_images(images, per_class)
    return pack_folder(images, os.path.join(out_dir, "digits-rec"))


def box_image(rng, width=160, height=120):
    """A noisy image and its boxes [(class, x0, y0, x1, y1)], VOC's 1-based corners."""
    from PIL import Image
    pixels = rng.integers(0, 80, size=(height, width, 3)).astype(np.uint8)
    boxes = []
    for _ in range(int(rng.integers(1, 4))):
        label = int(rng.integers(0, len(CLASSES)))
        w, h = (int(rng.integers(40, 70)), int(rng.integers(20, 35)))
        if label == 1:
            w, h = h, w + 10  # tall
        w, h = min(w, width - 2), min(h, height - 2)
        x0, y0 = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        pixels[y0:y0 + h, x0:x0 + w] = (200, 60, 60) if label == 0 else (60, 60, 200)
        boxes.append((CLASSES[label], x0 + 1, y0 + 1, x0 + w, y0 + h))
    return Image.fromarray(pixels), boxes


def write_voc(out_dir, count, seed=0):
    root = os.path.join(out_dir, "voc", "VOC2007")
    for sub in ("JPEGImages", "Annotations", os.path.join("ImageSets", "Main")):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"{i:06d}" for i in range(count)]
    for name in names:
        image, boxes = box_image(rng)
        image.save(os.path.join(root, "JPEGImages", name + ".jpg"), quality=90)
        objects = "".join(OBJECT.format(name=c, x0=x0, y0=y0, x1=x1, y1=y1)
                          for c, x0, y0, x1, y1 in boxes)
        with open(os.path.join(root, "Annotations", name + ".xml"), "w") as out:
            out.write(f"<annotation><filename>{name}.jpg</filename><size><width>"
                      f"{image.width}</width><height>{image.height}</height><depth>3</depth>"
                      f"</size>\n{objects}</annotation>\n")
    cut = count * 3 // 4
    for split, chosen in (("trainval", names[:cut]), ("test", names[cut:])):
        with open(os.path.join(root, "ImageSets", "Main", split + ".txt"), "w") as out:
            out.write("".join(n + "\n" for n in chosen))
    return cut, count - cut


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--boxes", type=int, default=32)
    args = parser.parse_args(argv)
    (train, _), (val, _) = write_digits(args.out_dir, args.per_class)
    print(f"digits-rec: {train} train and {val} val images")
    train, test = write_voc(args.out_dir, args.boxes)
    print(f"voc/VOC2007: {train} trainval and {test} test images with boxes of {CLASSES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
