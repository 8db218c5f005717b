"""Datasets read from disk as they are trained on, and the loader that decodes them.

:class:`ImageDataset` is what :func:`hvdtrain.data.load.load_dataset` returns for
``imagefolder`` and ``recordio``: two splits that read one sample by position, and the class
names. :class:`ImageLoader` turns a sampler's positions into normalised batches, decoding
and augmenting on `data_workers` threads ahead of the training step. A sample that cannot be
read or decoded is left out of its batch and counted (``skipped``), so a bad file costs one
sample, never the job, and every rank still takes the same number of steps; a batch whose
every sample failed is empty. (How many may fail before the job ends is the training
loop's decision: ``--max-bad-samples``.)
"""
from __future__ import annotations

import logging
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import numpy as np

from . import images
from .errors import BadSample, DatasetError
from .pack_labels import record_class_names
from .paths import check_folder
from .transforms import Augment, check_jpeg_codec, eval_transform, train_transform

logger = logging.getLogger("hvdtrain")

DEFAULT_IMAGE_SIZE = 224
FORMATS = ("imagefolder", "recordio")


@dataclass
class ImageDataset:
    """Train and validation splits on disk plus what the model and loader need to know."""

    name: str
    train: object  # images.FolderSplit or images.RecordSplit
    test: object
    classes: List[str]
    image_size: int = DEFAULT_IMAGE_SIZE
    streamed = True

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> Tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    @property
    def num_train(self) -> int:
        return len(self.train)

    @property
    def num_test(self) -> int:
        return len(self.test)

    def fingerprint(self) -> str:
        """Sample counts and checksums of both splits' indexes (equal on every host that
        holds the same data)."""
        return (f"train {len(self.train)} {self.train.fingerprint()}, "
                f"val {len(self.test)} {self.test.fingerprint()}")


def load_images(kind: str, data_dir: Optional[str], image_size: Optional[int] = None) \
        -> ImageDataset:
    """Open the image folder or RecordIO pack in `data_dir` (nothing decoded yet)."""
    if not data_dir:
        raise DatasetError(f"--dataset {kind} needs --data-dir (see docs/data.md)")
    check_folder(data_dir, "--data-dir")
    check_jpeg_codec()
    size = image_size or DEFAULT_IMAGE_SIZE
    if kind == "imagefolder":
        classes, train, test = images.open_folder(data_dir)
        return ImageDataset(kind, train, test, classes, size)
    train, test = images.open_records(data_dir)
    return ImageDataset(kind, train, test, record_class_names(data_dir, train, test), size)


class ImageLoader:
    """Iterate over ``(images, labels)`` batches of a split in a sampler's order.

    Parameters
    ----------
    split : images.FolderSplit or images.RecordSplit
        Reads sample ``i`` as (encoded bytes, label).
    sampler : iterable of int with ``__len__``
        e.g. :class:`hvdtrain.data.sampler.SplitSampler`; its ``epoch`` seeds augmentation.
    batch_size : int
    train : bool
        Training augmentation (else the evaluation resize and centre crop).
    image_size : int
    data_workers : int
        Threads decoding batches ahead of the step; 0 decodes inline.
    seed : int
        With the epoch and the sample's position in the split, decides its augmentation.
    dtype : str
        The batches' image dtype (float16 halves what travels to a GPU).
    augment : transforms.Augment
        How strongly training varies images (default: ImageNet's settings).
    """

    def __init__(self, split, sampler, batch_size, train, image_size, data_workers=2,
                 seed=0, dtype="float32", augment=Augment()):
        self.split = split
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.train = bool(train)
        self.image_size = int(image_size)
        self.data_workers = int(data_workers)
        self.seed = int(seed)
        self.dtype = np.dtype(dtype)
        self.augment = augment
        self.skipped: List[str] = []

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def sample(self, index: int, epoch: int, out: Optional[np.ndarray] = None):
        """Sample `index` decoded and transformed as in `epoch`, and its label; the image
        is written into `out` when given (raises errors.BadSample)."""
        encoded, label = self.split.read(index)
        what = self.split.describe(index)
        if self.train:
            rng = np.random.default_rng([self.seed, epoch, index])
            return (train_transform(encoded, self.image_size, rng, what, self.dtype,
                                    self.augment, out=out), label)
        return eval_transform(encoded, self.image_size, what, self.dtype, out=out), label

    def _make_batch(self, index: np.ndarray, epoch: int) \
            -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Each image is written straight into its slot of the preallocated batch.
        out = np.empty((len(index),) + (3, self.image_size, self.image_size), self.dtype)
        labels = np.empty(len(index), np.int32)
        used = np.empty(len(index), np.int64)
        kept = 0
        for position in index:
            try:
                _, labels[kept] = self.sample(int(position), epoch, out=out[kept])
            except BadSample as err:
                logger.warning("skipped a sample that cannot be used: %s", err)
                self.skipped.append(str(err))
                continue
            used[kept] = position
            kept += 1
        # Possibly empty: the training step then adds nothing from this rank (and still
        # takes part in the exchange), and evaluation scores nothing.
        return out[:kept], labels[:kept], used[:kept]

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        for batch_images, labels, _ in self.batches():
            yield batch_images, labels

    def batches(self) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(images, labels, positions)`` batches: `positions` says which samples of the
        split the images are (those left out are not among them)."""
        self.skipped = []
        epoch = getattr(self.sampler, "epoch", 0)
        order = np.fromiter(self.sampler, dtype=np.int64, count=len(self.sampler))
        chunks = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.data_workers == 0:
            for index in chunks:
                yield self._make_batch(index, epoch)
            return
        # One batch per thread, at most data_workers + 1 in flight: a rank holds only these.
        with ThreadPoolExecutor(self.data_workers, thread_name_prefix="hvdtrain-data") as pool:
            pending = deque()
            for index in chunks:
                pending.append(pool.submit(self._make_batch, index, epoch))
                if len(pending) > self.data_workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
