"""Write a small image folder to try ``--dataset imagefolder`` and ``recordio`` on, no download.

    python -m hvdtrain.data.sample_images OUT_DIR [--per-class N]

The bundled handwritten digits (:func:`hvdtrain.data.datasets.digits_arrays`) drawn as
colour JPEGs (and a few PNGs) of 40-120 pixels a side, each digit in random colours at a
random place near the centre, sorted into ``OUT_DIR/train/<digit>/`` and
``OUT_DIR/val/<digit>/`` (80/20). Deterministic: the same files every time.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Tuple

import numpy as np

CLASS_NAMES = tuple(f"digit{d}" for d in range(10))


def render(digit: np.ndarray, rng: np.random.Generator):
    """One 8x8 digit (values 0-16) as a colour Pillow image of random size and placement.

    The digit stays inside the centred square that evaluation's centre crop keeps, and its
    ink is far from the paper's colour, so a small model can learn the set in a few epochs.
    """
    from PIL import Image
    width = int(rng.integers(40, 121))
    height = int(np.clip(width * rng.uniform(0.75, 1.33), 40, 120))
    short = min(width, height)
    side = int(short * rng.uniform(0.55, 0.8))
    background = rng.integers(170, 256, size=3)  # pale paper, dark ink, random tints
    ink = rng.integers(0, 90, size=3)
    mask = Image.fromarray((digit * (255 / 16)).astype(np.uint8)).resize((side, side),
                                                                          Image.BILINEAR)
    alpha = np.asarray(mask, np.float32)[..., None] / 255
    canvas = np.empty((height, width, 3), np.float32)
    canvas[:] = background
    room = int(short * 224 / 256) - side  # play inside the centre crop
    top = (height - short * 224 // 256) // 2 + int(rng.integers(0, max(room, 0) + 1))
    left = (width - short * 224 // 256) // 2 + int(rng.integers(0, max(room, 0) + 1))
    patch = canvas[top:top + side, left:left + side]
    canvas[top:top + side, left:left + side] = patch * (1 - alpha) + ink * alpha
    return Image.fromarray(canvas.astype(np.uint8))


def write_digit_images(out_dir: str, per_class: Optional[int] = None,
                       seed: int = 0) -> Tuple[int, int]:
    """Write the digits folder to `out_dir`; `per_class` caps the images per class (both
    splits together). Returns (train, val) counts."""
    from .datasets import digits_arrays
    images, labels = digits_arrays()
    rng = np.random.default_rng(seed)
    counts = [0, 0]
    for label in range(10):
        chosen = np.flatnonzero(labels == label)
        chosen = chosen[rng.permutation(len(chosen))][:per_class]
        cut = int(round(len(chosen) * 0.8))
        for number, index in enumerate(chosen):
            split = 0 if number < cut else 1
            folder = os.path.join(out_dir, ("train", "val")[split], CLASS_NAMES[label])
            os.makedirs(folder, exist_ok=True)
            image = render(images[index], rng)
            # Every tenth image a PNG: the folder format takes both.
            ext = "png" if number % 10 == 9 else "jpg"
            image.save(os.path.join(folder, f"{index:04d}.{ext}"), quality=90)
            counts[split] += 1
    return counts[0], counts[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--per-class", type=int, default=None,
                        help="at most this many images per class, train and val together "
                             "(80/20; default: all, ~180)")
    args = parser.parse_args(argv)
    train, val = write_digit_images(args.out_dir, args.per_class)
    print(f"wrote {train} train and {val} val images to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
