"""Any batch sampler split over the ranks: GluonNLP's ``FixedBucketSampler``, a Gluon
``BatchSampler`` over any sampler (``IntervalSampler``, a filter, a sampler of your own).

A batch sampler decides which samples go together (a bucket of similar lengths), so its
batches are split whole, never re-cut. Every rank draws the same batches for an epoch:

- from a fresh copy of the batch sampler as the DataLoader was given it (a sampler that
  shuffles in place, as ``FixedBucketSampler`` does, would otherwise make epoch e depend on
  every epoch before it, and a resumed run could not repeat it);
- with numpy's global generator seeded by ``np.random.seed([seed, epoch])`` and Python's by
  ``random.seed(seed * 2**32 + epoch)`` (both put back as they were after the draw): the
  generators a batch sampler shuffles with (``FixedBucketSampler`` and Gluon's
  ``RandomSampler`` call ``np.random.shuffle``);
- with every generator of its own that the copy holds (a ``numpy.random.RandomState`` or
  ``Generator``, a ``random.Random``, found among its attributes, its sampler's and so on)
  seeded from (seed, epoch, its place): a copy of one made once would otherwise draw the
  same order every epoch.

The epoch's batches ``B[0], B[1], ...`` are then dealt out by rank: rank r takes
``B[r], B[r + N], ...``, so step k of N ranks trains on ``B[kN] .. B[kN + N - 1]``, whatever
their sizes (the engine divides every step by the samples all ranks held in it). For
training the list is padded to a multiple of N by repeating its first batches, so every
rank takes the same number of steps; for validation it is not, and each batch is scored
once, on one rank.

A resume inside an epoch counts positions, as for a plain loader: `processed` is the
number of sample positions the finished steps held on all ranks together, the sizes of the
epoch's first batches, so it names how many batches are done whatever the number of ranks
(an elastic reset deals the rest out over the ranks there are then).
"""
from __future__ import annotations

import copy
import itertools
import random
import zlib
from typing import List, Tuple

import numpy as np

from .errors import DatasetError


def draw_batches(batch_sampler, seed: int, epoch: int, shared=()) -> List[List[int]]:
    """The batches `batch_sampler` yields in epoch `epoch`: drawn from a fresh copy of it with
    numpy's and Python's global generators seeded from (`seed`, `epoch`), then restored.
    `shared` are objects the copy keeps as they are (the dataset: never copied). Refuses in
    one line a batch sampler that cannot be split over ranks."""
    name = type(batch_sampler).__name__
    try:
        expected = len(batch_sampler)
    except (TypeError, NotImplementedError):  # gluon.data.Sampler's own __len__ raises
        raise DatasetError(
            f"the DataLoader's batch sampler ({name}) has no len(): hvdtrain splits an "
            f"epoch's batches over the ranks and must know where it ends: give it a __len__ "
            f"and an end, or pass the Dataset itself (with batch_size)") from None
    fresh = _copy(batch_sampler, shared)
    _reseed(fresh, seed, epoch, shared)
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        np.random.seed([seed, epoch])
        random.seed(seed * 2 ** 32 + epoch)
        # One more than it says it has: an endless sampler is caught, not followed forever.
        batches = list(itertools.islice(iter(fresh), expected + 1))
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    if len(batches) > expected:
        raise DatasetError(
            f"the DataLoader's batch sampler ({name}) yields more batches than its len() of "
            f"{expected}: hvdtrain cannot split an endless epoch over the ranks: pass a batch "
            f"sampler whose epoch ends after len() batches")
    if not batches:
        raise DatasetError(f"the DataLoader's batch sampler ({name}) yields no batch: "
                           f"nothing to train on")
    return [_indices(batch, name) for batch in batches]


def _copy(batch_sampler, shared):
    """A deep copy of `batch_sampler` sharing the objects `shared` (never copied)."""
    try:
        return copy.deepcopy(batch_sampler, {id(s): s for s in shared})
    except Exception as err:  # pylint: disable=broad-except
        raise DatasetError(
            f"the DataLoader's batch sampler ({type(batch_sampler).__name__}) cannot be "
            f"copied ({err}): hvdtrain draws each epoch from a fresh copy, so that the "
            f"epoch's batches depend on (seed, epoch) alone: pass one that copy.deepcopy "
            f"can copy") from None


def _reseed(root, seed: int, epoch: int, shared, depth: int = 6) -> None:
    """Seed each generator `root` holds of its own from (`seed`, `epoch`, its place in a
    walk of the attributes, in their order: the same on every rank)."""
    seen, found = {id(s) for s in shared}, [0]

    def walk(obj, left):
        if id(obj) in seen or left < 0:
            return
        seen.add(id(obj))
        entropy = [seed % 2 ** 32, seed // 2 ** 32 % 2 ** 32, epoch, 1 + found[0]]
        if isinstance(obj, np.random.RandomState):
            found[0] += 1
            obj.seed(np.random.SeedSequence(entropy).generate_state(4))
        elif isinstance(obj, np.random.Generator):
            found[0] += 1
            bits = obj.bit_generator
            bits.state = type(bits)(np.random.SeedSequence(entropy)).state
        elif isinstance(obj, random.Random):
            found[0] += 1
            obj.seed(int(np.random.SeedSequence(entropy).generate_state(2, np.uint64)[0]))
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(value, left - 1)
        elif isinstance(obj, (list, tuple)):
            if len(obj) < 64:  # a sampler's attributes, not its indices
                for value in obj:
                    walk(value, left - 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, np.ndarray)):
            walk(vars(obj), left - 1)
    walk(root, depth)


def _indices(batch, name: str) -> List[int]:
    """`batch` as a list of sample indices; a batch of batches (GluonNLP's ``num_shards``)
    or of anything but whole numbers is refused."""
    indices = list(batch)
    if not indices or not all(isinstance(i, (int, np.integer)) for i in indices):
        raise DatasetError(
            f"the DataLoader's batch sampler ({name}) yields a batch that is not a non-empty "
            f"list of sample indices ({str(indices)[:60]}): hvdtrain splits the batches over "
            f"the ranks itself, so pass one that yields plain batches (for GluonNLP's "
            f"FixedBucketSampler: num_shards=0)")
    return [int(i) for i in indices]


class BatchSplit:
    """One rank's batches of a batch sampler's epochs (see the module).

    Parameters
    ----------
    batch_sampler : iterable of lists of int
        The DataLoader's batch sampler, kept as given; each epoch is drawn from a copy.
    length : int
        The samples of the dataset (the split's size: an epoch's positions, when its
        first draws more).
    num_parts, part_index : int
        The number of ranks and this one.
    seed : int
        Seeds each epoch's draw, with the epoch; the same on every rank.
    pad : bool
        Training: pad the epoch's batches to a multiple of `num_parts` by repeating its
        first ones. Validation: no padding (ranks then differ by at most one batch).
    shared : tuple
        Objects the copies keep as they are (the dataset).

    It is this rank's batch sampler for the next iteration: ``set_epoch(epoch, processed)``
    selects the epoch and the positions already trained in it, ``reshard`` the ranks.
    """

    def __init__(self, batch_sampler, length: int, num_parts: int = 1, part_index: int = 0,
                 seed: int = 0, pad: bool = True, shared=()):
        # Copied now: the user's object may be iterated later (a shuffle in place), and the
        # epochs must stay those of the sampler as it was given.
        self._shared = tuple(shared)
        self._batch_sampler = _copy(batch_sampler, self._shared)
        self.length, self.seed, self.pad = int(length), int(seed), bool(pad)
        self.epoch, self.processed = 0, 0
        self.num_parts, self.part_index = 1, 0
        self.reshard(num_parts, part_index)
        self._drawn: Tuple[int, List[List[int]]] = (0, self._draw(0))
        self._rest: Tuple[tuple, List[List[int]]] = ((), [])  # (its key, rest())
        # What records and logs call the batch size: the largest batch of the first epoch.
        self.batch_size = max(len(batch) for batch in self._drawn[1])
        # A sampler that draws samples more than once may hold more positions than that.
        self.length = max(self.length, sum(len(batch) for batch in self._drawn[1]))
        # The first epoch's batches in one number, which every rank must agree on.
        self.digest = zlib.crc32(np.concatenate(
            [np.asarray(b, dtype=np.int64) for b in self._drawn[1]]
            + [np.cumsum([len(b) for b in self._drawn[1]])]).tobytes())

    def _draw(self, epoch: int) -> List[List[int]]:
        return draw_batches(self._batch_sampler, self.seed, epoch, self._shared)

    def reshard(self, num_parts: int, part_index: int) -> None:
        """Deal the batches out over `num_parts` ranks from the next iteration on, this one
        being `part_index` (an elastic reset)."""
        if num_parts <= 0 or not 0 <= part_index < num_parts:
            raise ValueError(f"part_index must be in [0, {num_parts}), got {part_index}")
        self.num_parts, self.part_index = int(num_parts), int(part_index)

    def set_epoch(self, epoch: int, processed: int = 0) -> None:
        """Select the epoch the next iteration yields, leaving out its first batches, which
        held `processed` sample positions on all ranks together."""
        if int(processed) < 0:
            raise ValueError(f"processed must be at least 0, got {processed}")
        self.epoch, self.processed = int(epoch), int(processed)
        self._done()  # a position between two batches is refused now, not mid-iteration

    def batches(self) -> List[List[int]]:
        """The epoch's batches in order, identical on every rank (drawn once an epoch)."""
        if self._drawn[0] != self.epoch:
            self._drawn = (self.epoch, self._draw(self.epoch))
        return self._drawn[1]

    def _done(self) -> int:
        """How many of the epoch's first batches `processed` positions are."""
        if not self.processed:
            return 0
        ends = np.cumsum([len(batch) for batch in self.batches()])
        done = int(np.searchsorted(ends, self.processed)) + 1
        if done >= len(ends) or ends[done - 1] != self.processed:  # the last: no stop
            raise DatasetError(
                f"{self.processed} positions into epoch {self.epoch + 1} is not where one of "
                f"its batches ends (the batch sampler's batches end at "
                f"{', '.join(str(e) for e in ends[:5])}, ...): resume with the batch sampler "
                f"and seed the run stopped with")
        return done

    def rest(self) -> List[List[int]]:
        """The epoch's batches still to run on all ranks, padded for training to a multiple
        of the ranks with the epoch's first batches (as an uninterrupted epoch is: with the
        same ranks, a resumed epoch runs the batches it would have run)."""
        key = (self.epoch, self.processed, self.num_parts)
        if self._rest[0] != key:  # asked once a batch (positions): made once an iteration
            order = self.batches()
            rest = order[self._done():]
            if self.pad:
                missing = -len(rest) % self.num_parts
                rest = rest + [order[i % len(order)] for i in range(missing)]
            self._rest = (key, rest)
        return self._rest[1]

    def positions(self, batch_number: int) -> Tuple[int, int]:
        """(this rank's positions in its batch `batch_number` of the iteration, counted from
        1; the positions all ranks' batches at that step hold together)."""
        rest, first = self.rest(), (batch_number - 1) * self.num_parts
        step = rest[first:first + self.num_parts]
        mine = first + self.part_index
        return (len(rest[mine]) if mine < len(rest) else 0), sum(len(b) for b in step)

    def __iter__(self):
        return iter(self.rest()[self.part_index::self.num_parts])

    def __len__(self) -> int:
        return len(range(self.part_index, len(self.rest()), self.num_parts))


def check_same_draw(split: BatchSplit, dist) -> None:
    """Refuse, on every rank alike, a batch sampler that drew another first epoch on some
    rank: one made otherwise there, or iterated before ``fit`` with each rank's own
    generator (a shuffle in place), would leave samples out and train others twice. One
    exact sum over the ranks: each half of the digest and its square, all equal exactly
    when ``N * sum(h * h) == sum(h) ** 2`` (the same verdict on every rank)."""
    if dist.num_workers == 1:
        return
    halves = (split.digest >> 16, split.digest & 0xFFFF)
    sums = dist.agree("batch_sampler_draw", payload=[
        v for h in halves for v in (h, h * h)]).tolist()
    if any(dist.num_workers * sums[i + 1] != sums[i] ** 2 for i in (0, 2)):
        raise DatasetError(
            "the DataLoader's batch sampler drew other batches on other ranks, seeded alike: "
            "make it the same way on every rank and pass it to fit before iterating it (a "
            "shuffle in place with each rank's own generator makes it differ)")

