"""The top of the data package: a dataset by name, in memory or streamed from disk.

The package reads bottom-up, with no circle (tests/unit/test_layout.py)::

    load --> datasets (in memory: digits, CIFAR-10, synthetic)
    load --> streamed --> pack_labels, transforms, images, paths
    pack_labels --> images --> paths
    pack (hvdtrain-pack) --> images, transforms, paths
    every module --> errors
"""
from __future__ import annotations

from typing import Optional

from .datasets import SYNTHETIC_SIZE, check_dataset, load_cifar10, load_digits, make_synthetic
from .streamed import load_images


def load_dataset(name: str, data_dir: Optional[str] = None, image_size: Optional[int] = None):
    """Load dataset `name` ('cifar10', 'digits' or 'synthetic'), or open the image folder
    or RecordIO pack in `data_dir` ('imagefolder', 'recordio'; images at `image_size`).
    `image_size` also sets the side of synthetic's random images (default 32)."""
    if name in ("imagefolder", "recordio"):
        return load_images(name, data_dir, image_size)
    check_dataset(name, data_dir)
    if name == "cifar10":
        return load_cifar10(data_dir)
    if name == "digits":
        return load_digits()
    return make_synthetic(image_size=image_size or SYNTHETIC_SIZE)
