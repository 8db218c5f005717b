"""A Gluon ``DataLoader`` (or ``Dataset``) resharded: this rank's share of every epoch.

:class:`ShardedLoader` keeps what the user's loader says about its batches (the batch size,
``batchify_fn``, the workers and their kind, pinned memory, ``last_batch``) and replaces only
its sampler. A loader made with ``batch_size`` (its batches cut from a ``RandomSampler`` or a
``SequentialSampler``) gets :class:`~hvdtrain.data.sampler.SplitSampler`: each epoch's order
is shuffled from (seed, epoch) when the loader shuffled and kept when it did not, padded to
equal parts for training (every rank takes the same number of steps) and left unpadded for
validation (every sample is scored once, on one rank), and resumed exactly inside an epoch
(``set_epoch(epoch, processed)``). A loader whose batches come from a batch sampler of its
own (GluonNLP's ``FixedBucketSampler``, a ``BatchSampler`` over any other sampler) keeps its
batches whole: each epoch's are drawn alike on every rank and dealt out by rank
(:class:`~hvdtrain.data.batch_shards.BatchSplit`), padded and resumed the same way. Refused
in one line that says what to pass instead: ``last_batch='rollover'``, whose batches cross
epochs, and a batch sampler with no end.

Unusable samples, the protocol a dataset can follow: its ``__getitem__`` raises
:class:`~hvdtrain.data.errors.BadSample` (with a message naming the sample) for a sample that
cannot be read or decoded. The sample is left out of its batch and counted, exactly as
hvdtrain's own image loaders do (``--max-bad-samples``), and a batch of nothing but unusable
samples is ``None``. Any other exception ends the run, as it would without hvdtrain.
"""
from __future__ import annotations

import logging
from typing import Iterator, List, Optional

from mxnet import gluon

from .batch_shards import BatchSplit
from .errors import BadSample, DatasetError
from .sampler import SplitSampler

logger = logging.getLogger("hvdtrain")

# How a batch with unusable samples travels from the batchify function (possibly in a worker
# process, through pickling and pinned-memory copies that turn tuples into lists) to the
# loop: [MARK, the batch of the usable samples or None, [why each other was unusable]].
MARK = "hvdtrain-unusable-samples"


class _Unusable:
    """What the guarded dataset returns in place of a sample that raised BadSample."""

    def __init__(self, why: str):
        self.why = why


class GuardedDataset(gluon.data.Dataset):
    """`dataset`, with each sample that raises :class:`BadSample` replaced by a note of why."""

    def __init__(self, dataset):
        self._dataset = dataset

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, index):
        try:
            return self._dataset[index]
        except BadSample as err:
            return _Unusable(str(err) or f"sample {index}")


class CountingBatchify:
    """The user's `batchify` over the usable samples; the unusable ones are left out and
    named (see :data:`MARK`). A batch of usable samples only is what `batchify` makes, as
    it is."""

    def __init__(self, batchify):
        self._batchify = batchify

    def __call__(self, samples):
        bad = [s.why for s in samples if isinstance(s, _Unusable)]
        if not bad:
            return self._batchify(samples)
        good = [s for s in samples if not isinstance(s, _Unusable)]
        return [MARK, self._batchify(good) if good else None, bad]


class EpochBatches(gluon.data.Sampler):
    """Batches of `batch_size` positions from `sampler`'s current epoch; the last one kept
    short (``'keep'``) or left out (``'discard'``)."""

    def __init__(self, sampler: SplitSampler, batch_size: int, last_batch: str = "keep"):
        self.sampler, self.batch_size, self.last_batch = sampler, int(batch_size), last_batch

    def __iter__(self):
        order = self.sampler.indices().tolist()
        stop = len(order) if self.last_batch == "keep" else \
            len(order) - len(order) % self.batch_size
        for start in range(0, stop, self.batch_size):
            yield order[start:start + self.batch_size]

    def __len__(self):
        if self.last_batch == "keep":
            return -(-len(self.sampler) // self.batch_size)
        return len(self.sampler) // self.batch_size

    def positions(self, batch_number: int):
        """(this rank's positions in its batch `batch_number`, counted from 1: the last may
        be short; the positions of that step on all ranks together: full batches)."""
        first = (batch_number - 1) * self.batch_size
        return (min(self.batch_size, len(self.sampler) - first),
                self.batch_size * self.sampler.num_parts)


class ShardedLoader:
    """This rank's share of a Gluon DataLoader's batches, epoch by epoch (see the module).

    Parameters
    ----------
    loader : gluon.data.DataLoader
        The user's loader: its dataset, batch size, ``batchify_fn``, workers and
        ``last_batch`` are kept; its sampler is replaced.
    num_parts, part_index : int
        The number of ranks and this one.
    train : bool
        Training (padded to equal parts, the loader's ``last_batch``) or validation
        (unpadded: every sample once; every batch kept).
    seed : int
        The shuffle's seed (with the epoch), the same on every rank.
    mode : {'strided', 'contiguous'}
        How the order is split over the ranks (``sampling``).

    Attributes
    ----------
    sampler : SplitSampler or BatchSplit
        Its ``set_epoch(epoch, processed)`` selects what the next iteration yields, its
        ``reshard(num_parts, part_index)`` the ranks.
    batch_size : int
        Positions per batch (a batch sampler's: its first epoch's largest batch).
    skipped : list of str
        Why each unusable sample of the current epoch was left out, on this rank.
    """

    def __init__(self, loader: gluon.data.DataLoader, num_parts: int, part_index: int,
                 train: bool, seed: int = 0, mode: str = "strided"):
        batches = getattr(loader, "_batch_sampler", None)
        if getattr(batches, "_last_batch", None) == "rollover":
            raise DatasetError("DataLoader(last_batch='rollover') carries batches across "
                               "epochs, which no rank can resume or split alike: use 'keep' "
                               "or 'discard'")
        dataset = loader._dataset  # pylint: disable=protected-access
        if len(dataset) == 0:
            raise DatasetError("the DataLoader's dataset is empty: nothing to train on")
        self.skipped: List[str] = []
        self.num_samples = len(dataset)
        inner = getattr(batches, "_sampler", None)
        if type(batches) is gluon.data.BatchSampler and type(inner) in (  # pylint: disable=unidiomatic-typecheck
                gluon.data.RandomSampler, gluon.data.SequentialSampler):
            # Batches cut from an order: the order is split (positions), then cut again.
            self.batch_size = int(batches._batch_size)  # pylint: disable=protected-access
            self.sampler = SplitSampler(len(dataset), num_parts, part_index,
                                        shuffle=isinstance(inner, gluon.data.RandomSampler),
                                        seed=seed, mode=mode if train else "strided", pad=train)
            asked = batches._last_batch  # pylint: disable=protected-access
            if asked == "discard" and not train:
                # Discarding each shard's short batch would leave out samples that one
                # process leaves in (its one short batch is elsewhere): every sample is scored.
                logger.warning("the validation DataLoader's last_batch='discard' is not "
                               "followed: each rank scores its whole share, so every sample "
                               "is scored once (a short last batch included)")
            self.last_batch = asked if train else "keep"
            self._batches = EpochBatches(self.sampler, self.batch_size, self.last_batch)
        else:
            # Batches a sampler made (buckets): dealt out whole, strided by rank.
            self.sampler = self._batches = BatchSplit(
                batches, len(dataset), num_parts, part_index, seed=seed, pad=train,
                shared=(dataset, loader))
            self.batch_size, self.last_batch = self.sampler.batch_size, "keep"
            self.num_samples = self.sampler.length
        self._loader = gluon.data.DataLoader(
            GuardedDataset(dataset),
            batch_sampler=self._batches,
            batchify_fn=CountingBatchify(loader._batchify_fn),  # pylint: disable=protected-access
            num_workers=loader._num_workers,  # pylint: disable=protected-access
            pin_memory=loader._pin_memory,  # pylint: disable=protected-access
            pin_device_id=loader._pin_device_id,  # pylint: disable=protected-access
            prefetch=loader._prefetch,  # pylint: disable=protected-access
            thread_pool=loader._thread_pool,  # pylint: disable=protected-access
            timeout=loader._timeout)  # pylint: disable=protected-access

    def __len__(self) -> int:
        return len(self._loader)

    def batch_positions(self, batch_number: int):
        """(the positions of the epoch's order this rank's batch `batch_number` of the
        iteration consumed, counted from 1; those its step consumed on all ranks together):
        what the engine counts a stop's place in the epoch and the unusable samples by."""
        return self._batches.positions(batch_number)

    def __iter__(self) -> Iterator:
        self.skipped = []
        for batch in self._loader:
            if isinstance(batch, (list, tuple)) and len(batch) == 3 and \
                    isinstance(batch[0], str) and batch[0] == MARK:
                _, batch, bad = batch
                for why in bad:
                    logger.warning("skipped a sample that cannot be used: %s", why)
                self.skipped.extend(bad)
            yield batch


def as_loader(data, batch_size: Optional[int] = None, shuffle: bool = False,
              num_workers: int = 0) -> gluon.data.DataLoader:
    """`data` as a Gluon DataLoader: itself, or a Dataset batched by `batch_size`."""
    if isinstance(data, gluon.data.DataLoader):
        return data
    return gluon.data.DataLoader(data, batch_size=batch_size, shuffle=shuffle,
                                 last_batch="keep", num_workers=num_workers)
