"""The datasets hvdtrain trains on: in memory as numpy arrays (digits, CIFAR-10, synthetic),
or streamed from disk (image folders and RecordIO: :mod:`hvdtrain.data.streamed`).

In-memory images are kept compact (CIFAR as uint8) and turned into normalised float batches
by :mod:`hvdtrain.data.loader`, one whole batch at a time.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from .errors import DatasetError

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch.bin"
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
# Label i's name, as the archive's batches.meta.txt lists them.
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck")
CIFAR_SOURCE = ("download the binary version (cifar-10-binary.tar.gz) from "
                "https://www.cs.toronto.edu/~kriz/cifar.html and extract it there")


@dataclass
class Dataset:
    """Train and test arrays plus what the model and the loader need to know.

    Images are ``(N, C, H, W)``: uint8 in ``[0, 255]`` when `mean`/`std` are given
    (normalised per batch), float32 already normalised otherwise.
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    augment: bool = False
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None
    streamed = False

    @property
    def image_shape(self) -> Tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.train_y)

    @property
    def num_test(self) -> int:
        return len(self.test_y)


def check_dataset(name: str, data_dir: Optional[str] = None) -> None:
    """Refuse, without reading a sample, a dataset that cannot load: an unknown name, or
    CIFAR-10 files that are missing or not whole records (so a run can refuse them before
    it judges its output folder)."""
    if name not in ("cifar10", "digits", "synthetic", "imagefolder", "recordio"):
        raise DatasetError(f"unknown dataset {name!r}; expected cifar10, digits, synthetic, "
                           f"imagefolder or recordio")
    if name != "cifar10":
        return  # image sets check their layout when opened, still before anything is written
    if not data_dir:
        raise DatasetError("--dataset cifar10 needs --data-dir; " + CIFAR_SOURCE)
    folder = _cifar_dir(data_dir)
    wanted = CIFAR_TRAIN_FILES + (CIFAR_TEST_FILE,)
    missing = [f for f in wanted if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise DatasetError(f"CIFAR-10 binary files missing in {os.path.abspath(folder)}: "
                           f"{', '.join(missing)}; {CIFAR_SOURCE}")
    for path in (os.path.join(folder, f) for f in wanted):
        _check_cifar_size(path, os.path.getsize(path))


def _check_cifar_size(path: str, size: int) -> None:
    if size == 0 or size % CIFAR_RECORD:
        raise DatasetError(f"{path} is not a CIFAR-10 binary file: {size} bytes is not a "
                           f"whole number of {CIFAR_RECORD}-byte records (truncated?)")


def _cifar_dir(data_dir: str) -> str:
    """`data_dir` itself, or the `cifar-10-batches-bin` folder the archive extracts to."""
    nested = os.path.join(data_dir, "cifar-10-batches-bin")
    if not os.path.exists(os.path.join(data_dir, CIFAR_TEST_FILE)) and os.path.isdir(nested):
        return nested
    return data_dir


def read_cifar_file(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary file: records of 1 label byte and 3x32x32 pixel bytes."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as err:
        raise DatasetError(f"cannot read CIFAR-10 file {path}: {err.strerror}") from None
    _check_cifar_size(path, raw.size)
    records = raw.reshape(-1, CIFAR_RECORD)
    labels = records[:, 0].astype(np.int32)
    if labels.max() > 9:
        raise DatasetError(f"{path} is not a CIFAR-10 binary file: label {labels.max()} > 9")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def load_cifar10(data_dir: Optional[str]) -> Dataset:
    """CIFAR-10 from the standard binary files in `data_dir`."""
    check_dataset("cifar10", data_dir)
    folder = _cifar_dir(data_dir)
    parts = [read_cifar_file(os.path.join(folder, f)) for f in CIFAR_TRAIN_FILES]
    test_x, test_y = read_cifar_file(os.path.join(folder, CIFAR_TEST_FILE))
    return Dataset("cifar10", np.concatenate([p[0] for p in parts]),
                   np.concatenate([p[1] for p in parts]), test_x, test_y, num_classes=10,
                   augment=True, mean=CIFAR_MEAN, std=CIFAR_STD)


def write_cifar_files(folder: str, num_train: int, num_test: int, seed: int = 0) -> None:
    """Write random CIFAR-format binary files (for tests and benchmarks; no download).

    The labels are a function of the images' mean brightness, so a model can learn them.
    """
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    sizes = [num_train // 5 + (1 if i < num_train % 5 else 0) for i in range(5)]
    for name, count in zip(CIFAR_TRAIN_FILES + (CIFAR_TEST_FILE,), sizes + [num_test]):
        images = rng.integers(0, 256, size=(count, 3 * 32 * 32), dtype=np.uint8)
        labels = (images.mean(axis=1) * 10 // 256).astype(np.uint8)
        np.concatenate([labels[:, None], images], axis=1).tofile(os.path.join(folder, name))


# The 1,797 8x8 handwritten digits of UCI's "Optical Recognition of Handwritten Digits"
# (test set; E. Alpaydin and C. Kaynak, CC BY 4.0), as scikit-learn's load_digits() gives
# them: images with values 0-16 and their labels. Bundled (45 KB) so that the demo needs no
# download and no scikit-learn, whose import MXNet would then run in every process
# (docs/data.md).
DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")


def digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """The bundled digits: uint8 images ``(1797, 8, 8)`` in ``[0, 16]`` and uint8 labels."""
    with np.load(DIGITS_FILE) as bundled:
        return bundled["images"], bundled["labels"]


def load_digits() -> Dataset:
    """The bundled 8x8 handwritten digits, with a fixed 80/20 split."""
    images, labels = digits_arrays()
    images = (images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    labels = labels.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    test, train = order[:360], order[360:]
    return Dataset("digits", images[train], labels[train], images[test], labels[test],
                   num_classes=10)


SYNTHETIC_SIZE = 32
# Larger synthetic images come in fewer copies: the training split stays within this many
# bytes (1782 images at 224), so a throughput run at ImageNet's size fits any host.
SYNTHETIC_BYTES = 256 * 2**20


def make_synthetic(num_train: Optional[int] = None, num_test: Optional[int] = None,
                   seed: int = 0, image_size: int = SYNTHETIC_SIZE) -> Dataset:
    """Random uint8 images and random labels, for throughput runs: no decoding and no
    augmentation, so a run on them measures the model and the exchange alone (at
    `image_size`, a run's figure without its input work: docs/data.md).

    By default 8192 training images (fewer above 32 pixels: at most ``SYNTHETIC_BYTES``)
    and an eighth as many test images."""
    rng = np.random.default_rng(seed)
    shape = (3, image_size, image_size)
    if num_train is None:
        num_train = max(64, min(8192, SYNTHETIC_BYTES // int(np.prod(shape))))
    if num_test is None:
        num_test = max(8, num_train // 8)
    return Dataset("synthetic",
                   rng.integers(0, 256, size=(num_train,) + shape, dtype=np.uint8),
                   rng.integers(0, 10, size=num_train).astype(np.int32),
                   rng.integers(0, 256, size=(num_test,) + shape, dtype=np.uint8),
                   rng.integers(0, 10, size=num_test).astype(np.int32),
                   num_classes=10, augment=False, mean=CIFAR_MEAN, std=CIFAR_STD)
