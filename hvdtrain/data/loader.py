"""Batches from in-memory arrays: whole-batch augmentation and background prefetch.

Augmenting a whole batch with numpy indexing costs a few array operations per batch instead
of Python calls per sample, and a small thread pool prepares the next batches while the
current step runs.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np


def random_crop_flip(images: np.ndarray, rng: np.random.Generator, pad: int = 4) -> np.ndarray:
    """Pad each image by `pad` pixels, crop it back at a random offset, flip half of them.

    One gather over a sliding-window view of the padded batch: no Python per sample
    (0.8 ms for 64 CIFAR images here, against 2.7 ms for a per-pixel fancy index).

    Parameters
    ----------
    images : ndarray, shape (B, C, H, W)
    rng : numpy Generator
        Decides the offsets and flips.
    """
    batch, _, height, width = images.shape
    padded = np.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (height, width), axis=(2, 3))
    top = rng.integers(0, 2 * pad + 1, size=batch)
    left = rng.integers(0, 2 * pad + 1, size=batch)
    out = windows[np.arange(batch), :, top, left]
    flip = rng.random(batch) < 0.5
    out[flip] = out[flip, :, :, ::-1]
    return out


def normalize(images: np.ndarray, mean: Optional[Sequence[float]],
              std: Optional[Sequence[float]]) -> np.ndarray:
    """uint8 pixels to float32 ``(x / 255 - mean) / std`` per channel; floats pass through."""
    if mean is None:
        return images.astype(np.float32, copy=False)
    scale = (1.0 / (255.0 * np.asarray(std, np.float32)))[:, None, None]
    shift = (np.asarray(mean, np.float32) / np.asarray(std, np.float32))[:, None, None]
    return images.astype(np.float32) * scale - shift


class BatchLoader:
    """Iterate over ``(images, labels)`` numpy batches in a sampler's order.

    Parameters
    ----------
    images, labels : ndarray
        The whole split, first axis indexed by the sampler.
    sampler : iterable of int with ``__len__``
        e.g. :class:`hvdtrain.data.sampler.SplitSampler`; its epoch is set by the caller.
    batch_size : int
        The last batch of an epoch may be smaller (it is, on every rank alike).
    augment : bool
        Random crop with 4-pixel padding and horizontal flip.
    mean, std : sequences of float, optional
        Per-channel normalisation of uint8 images.
    data_workers : int
        Threads preparing batches ahead of the training step; 0 prepares them inline.
    seed : int
        With the epoch and batch number, decides the augmentation, so it does not depend
        on thread timing.
    """

    def __init__(self, images, labels, sampler, batch_size, augment=False, mean=None,
                 std=None, data_workers=2, seed=0):
        self.images = images
        self.labels = labels
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.augment = augment
        self.mean = mean
        self.std = std
        self.data_workers = int(data_workers)
        self.seed = int(seed)

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def _make_batch(self, number: int, index: np.ndarray) \
            -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        images = self.images[index]
        if self.augment:
            epoch = getattr(self.sampler, "epoch", 0)
            part = getattr(self.sampler, "part_index", 0)
            rng = np.random.default_rng([self.seed, epoch, part, number])
            images = random_crop_flip(images, rng)
        return normalize(images, self.mean, self.std), self.labels[index], index

    def first_batch(self) -> int:
        """Number of this epoch's first batch: batches a resumed epoch already ran (the
        sampler's ``processed`` samples over the global batch), so augmentation repeats."""
        processed = getattr(self.sampler, "processed", 0)
        return processed // (self.batch_size * getattr(self.sampler, "num_parts", 1))

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        for images, labels, _ in self.batches():
            yield images, labels

    def batches(self) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(images, labels, positions)`` batches: `positions` are the samples' indices
        in the split."""
        order = np.fromiter(self.sampler, dtype=np.int64, count=len(self.sampler))
        chunks = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        first = self.first_batch()
        if self.data_workers == 0:
            for number, index in enumerate(chunks, first):
                yield self._make_batch(number, index)
            return
        with ThreadPoolExecutor(self.data_workers, thread_name_prefix="hvdtrain-data") as pool:
            pending = deque()
            ahead = 2 * self.data_workers
            for number, index in enumerate(chunks, first):
                pending.append(pool.submit(self._make_batch, number, index))
                if len(pending) > ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
