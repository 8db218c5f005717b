"""Splitting a dataset over workers so that every worker takes the same number of steps."""
from __future__ import annotations

import numpy as np

from ..config import choices_of

MODES = choices_of("sampling")


class SplitSampler:
    """Sample the indices of one worker's part of a dataset.

    Every epoch the indices ``0 .. length-1`` are shuffled with a generator seeded by
    ``(seed, epoch)``, so every rank draws the same permutation without communicating.
    The permutation is then padded by wrapping around to a multiple of `num_parts` (no sample
    is dropped, and every part has the same length, so no rank runs out of batches before the
    others and hangs an allreduce) and split:

    - ``mode='strided'``: part ``i`` takes positions ``i, i + num_parts, ...``. Then N workers
      with batch b see at step k exactly the samples that one worker with batch N*b sees at
      step k: positions ``k*N*b .. (k+1)*N*b - 1`` of the shared permutation.
    - ``mode='contiguous'``: part ``i`` takes one block of consecutive positions, as MXNet's
      example ``SplitSampler`` does.

    Parameters
    ----------
    length : int
        Number of samples in the dataset.
    num_parts : int, default 1
        Number of workers the data is split over.
    part_index : int, default 0
        Which part this sampler yields (the worker's rank).
    shuffle : bool, default False
        Whether to shuffle every epoch.
    seed : int, default 0
        Base seed of the shuffle; must be the same on every rank.
    mode : {'strided', 'contiguous'}, default 'strided'
        How parts are cut from the padded permutation.
    pad : bool, default True
        Pad to equal part lengths. Evaluation passes False so that each sample is counted
        exactly once (parts then differ in length by at most one).

    A run stopped inside an epoch resumes it with ``set_epoch(epoch, processed)``: like
    Horovod's ``ElasticSampler.processed_num``, `processed` counts the samples all workers
    together have trained on this epoch, and the iteration yields only the rest. In strided
    mode those were the first `processed` positions of the permutation, so the rest is split
    over however many workers there are now; padding still wraps from the permutation's start,
    so with the same worker count the batches are exactly those an uninterrupted epoch runs.
    In contiguous mode each part skips ``processed // num_parts`` of its own block, which is
    only right with the worker count the run stopped with.
    """

    def __init__(self, length, num_parts=1, part_index=0, shuffle=False, seed=0,
                 mode="strided", pad=True):
        if length <= 0:
            raise ValueError(f"SplitSampler needs a non-empty dataset, got length {length}")
        if num_parts <= 0 or not 0 <= part_index < num_parts:
            raise ValueError(f"part_index must be in [0, {num_parts}), got {part_index}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.length = int(length)
        self.num_parts = int(num_parts)
        self.part_index = int(part_index)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.mode = mode
        self.pad = bool(pad)
        self.epoch = 0
        self.processed = 0

    def reshard(self, num_parts, part_index):
        """Split over `num_parts` workers from the next iteration on, yielding part
        `part_index` (an elastic reset: the epoch's remaining samples are split over the
        workers there are now)."""
        if num_parts <= 0 or not 0 <= part_index < num_parts:
            raise ValueError(f"part_index must be in [0, {num_parts}), got {part_index}")
        self.num_parts, self.part_index = int(num_parts), int(part_index)

    def set_epoch(self, epoch, processed=0):
        """Select the epoch whose permutation the next iteration yields, leaving out the
        `processed` samples all workers together already trained on in it."""
        if not 0 <= int(processed) < self.length:
            raise ValueError(f"processed must be in [0, {self.length}), got {processed}")
        self.epoch = int(epoch)
        self.processed = int(processed)

    def permutation(self):
        """The order of the whole dataset this epoch, identical on every rank."""
        if not self.shuffle:
            return np.arange(self.length)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.length)

    def indices(self):
        """This part's indices for the current epoch, as an int64 array."""
        order = self.permutation()
        contiguous = self.mode == "contiguous" and self.pad
        rest = order if contiguous else order[self.processed:]
        if self.pad:
            # Wrap around from the permutation's start (np.resize repeats cyclically).
            missing = -len(rest) % self.num_parts
            rest = np.concatenate([rest, np.resize(order, missing)])
        if not contiguous:
            return rest[self.part_index::self.num_parts]
        size = len(rest) // self.num_parts
        block = rest[self.part_index * size:(self.part_index + 1) * size]
        return block[self.processed // self.num_parts:]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        if self.pad:
            if self.mode == "contiguous":
                return -(-self.length // self.num_parts) - self.processed // self.num_parts
            return -(-(self.length - self.processed) // self.num_parts)
        remaining = self.length - self.processed
        extra = 1 if self.part_index < remaining % self.num_parts else 0
        return remaining // self.num_parts + extra
