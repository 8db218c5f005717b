"""Any batch sampler split over the ranks (hvdtrain/data/batch_shards.py): every batch of an
epoch drawn once across the ranks (training: padded with the epoch's first batches to equal
step counts; validation: unpadded), the draw a function of (seed, epoch) alone, a resume
inside an epoch exact, an elastic reshard dealing the rest out, and what cannot be split
refused in one line."""
import itertools
import random

import gluonnlp as nlp
import numpy as np
import pytest
from mxnet import gluon

from hvdtrain.data.batch_shards import BatchSplit, draw_batches
from hvdtrain.data.errors import DatasetError
from hvdtrain.data.reshard import ShardedLoader
from hvdtrain.data.sampler import SplitSampler

LENGTHS = np.random.RandomState(0).randint(2, 30, size=101).tolist()
SEED = 5


def buckets(shuffle=True, **kw):
    return nlp.data.FixedBucketSampler(LENGTHS, batch_size=6, num_buckets=4, ratio=1.0,
                                       shuffle=shuffle, **kw)


def splits(sampler, ranks, pad=True, seed=SEED):
    return [BatchSplit(sampler, len(LENGTHS), ranks, r, seed=seed, pad=pad)
            for r in range(ranks)]


def documented_draw(epoch, seed=SEED):
    """docs/data.md's rule: a fresh sampler, numpy seeded by [seed, epoch], Python by
    seed * 2**32 + epoch."""
    np.random.seed([seed, epoch])
    random.seed(seed * 2 ** 32 + epoch)
    return [list(b) for b in buckets()]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7])
def test_training_deals_every_batch_once_padded_with_the_first_to_equal_steps(ranks):
    whole = documented_draw(0)
    parts = [list(p) for p in splits(buckets(), ranks)]
    assert len({len(p) for p in parts}) == 1  # equal step counts
    assert all(len(p) == len(s) for p, s in zip(parts, splits(buckets(), ranks)))
    padded = whole + [whole[i % len(whole)] for i in range(-len(whole) % ranks)]
    for rank, part in enumerate(parts):
        assert part == padded[rank::ranks]  # strided: step k is batches kN .. kN + N - 1
    dealt = sorted(tuple(b) for p in parts for b in p)
    assert dealt == sorted(tuple(b) for b in padded)
    assert len({len(b) for b in whole}) > 1  # batches of several sizes


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_validation_deals_every_batch_once_without_padding(ranks):
    whole = [list(b) for b in buckets(shuffle=False)]
    parts = [list(p) for p in splits(buckets(shuffle=False), ranks, pad=False)]
    assert sorted(tuple(b) for p in parts for b in p) == sorted(tuple(b) for b in whole)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert [len(p) for p in parts] == [len(s) for s in splits(buckets(False), ranks, False)]
    assert sorted(i for p in parts for b in p for i in b) == list(range(len(LENGTHS)))


def test_the_draw_depends_on_seed_and_epoch_alone_and_leaves_the_global_generators_alone():
    given = buckets()
    split = BatchSplit(given, len(LENGTHS), 2, 0, seed=SEED)
    for _ in range(3):  # the user's own object iterated later: shuffled in place
        list(given)
    np.random.seed(123)
    random.seed(123)
    expected = np.random.rand(), random.random()
    np.random.seed(123)
    random.seed(123)
    split.set_epoch(1)
    assert list(split) == documented_draw(1)[0::2]
    assert (np.random.rand(), random.random()) != expected  # documented_draw seeded them
    np.random.seed(123)
    random.seed(123)
    split.set_epoch(2)
    list(split)
    assert (np.random.rand(), random.random()) == expected  # the draw put them back
    first = draw_batches(buckets(), SEED, 1)
    assert first == draw_batches(buckets(), SEED, 1) == documented_draw(1)
    assert draw_batches(buckets(), SEED, 2) != first != draw_batches(buckets(), SEED + 1, 1)


def test_a_python_random_batch_sampler_draws_alike_on_every_rank():
    class PythonShuffled:
        def __len__(self):
            return 10

        def __iter__(self):
            order = list(range(40))
            random.shuffle(order)
            return iter([order[i:i + 4] for i in range(0, 40, 4)])

    ranks = [BatchSplit(PythonShuffled(), 40, 2, r, seed=SEED) for r in range(2)]
    random.seed(1)
    mine = list(ranks[0])
    random.seed(2)
    assert mine == list(BatchSplit(PythonShuffled(), 40, 2, 0, seed=SEED))
    assert sorted(i for r in ranks for b in r for i in b) == list(range(40))


@pytest.mark.parametrize("done_steps", [1, 2, 3])
def test_a_resume_inside_an_epoch_runs_the_batches_the_epoch_would_have(done_steps):
    ranks, epoch = 3, 2
    whole = splits(buckets(), ranks)
    for split in whole:
        split.set_epoch(epoch)
    uninterrupted = [list(s) for s in whole]
    order = documented_draw(epoch)
    assert done_steps * ranks < len(order)  # a stop inside the epoch
    processed = sum(len(b) for b in order[:done_steps * ranks])
    for rank, split in enumerate(splits(buckets(), ranks)):
        split.set_epoch(epoch, processed)
        assert list(split) == uninterrupted[rank][done_steps:]
        assert len(split) == len(uninterrupted[rank]) - done_steps
        # The engine's counts: this rank's batch, and the step's positions on all ranks.
        assert split.positions(1) == (len(uninterrupted[rank][done_steps]), sum(
            len(b) for b in order[done_steps * ranks:(done_steps + 1) * ranks]))


def test_an_elastic_reshard_deals_the_epoch_s_rest_over_the_ranks_there_are_now():
    order = documented_draw(0)
    processed = sum(len(b) for b in order[:4])  # two steps of 2 ranks
    # The 2 ranks that ran them, resharded to ranks 0 and 1 of 3, and a rank that joined.
    parts = splits(buckets(), 2) + [BatchSplit(buckets(), len(LENGTHS), seed=SEED)]
    for rank, split in enumerate(parts):
        split.reshard(3, rank)
        split.set_epoch(0, processed)
    rest = order[4:] + order[:-len(order[4:]) % 3]  # padded from the epoch's start
    assert [list(split) for split in parts] == [rest[r::3] for r in range(3)]
    with pytest.raises(DatasetError, match="is not where one of its batches ends"):
        parts[0].set_epoch(0, processed + 1)


def test_a_loader_on_any_batch_sampler_is_resharded_and_counts_its_positions():
    data = gluon.data.SimpleDataset([np.full((n,), i, dtype="float32")
                                     for i, n in enumerate(LENGTHS)])
    batchify = nlp.data.batchify.Pad(axis=0, pad_val=-1)
    loader = gluon.data.DataLoader(data, batch_sampler=buckets(), batchify_fn=batchify)
    mine = ShardedLoader(loader, 2, 1, train=True, seed=SEED)
    expected = documented_draw(0)
    expected += expected[:len(expected) % 2]
    assert isinstance(mine.sampler, BatchSplit) and len(mine) == len(expected) // 2
    for number, batch in enumerate(mine, 1):
        indices = expected[2 * number - 1]
        assert sorted(batch[:, 0].asnumpy().astype(int).tolist()) == sorted(indices)
        assert mine.batch_positions(number) == (len(indices), len(expected[2 * number - 2])
                                                + len(indices))
    assert mine.batch_size == max(len(b) for b in expected)
    # A Gluon BatchSampler over any sampler: IntervalSampler, a FilterSampler.
    for sampler in (gluon.contrib.data.IntervalSampler(len(data), 7),
                    gluon.data.FilterSampler(lambda x: x[0] % 2 == 0, data)):
        every = [list(b) for b in gluon.data.BatchSampler(sampler, 5, "keep")]
        loader = gluon.data.DataLoader(data, batch_sampler=gluon.data.BatchSampler(
            sampler, 5, "keep"), batchify_fn=batchify)
        parts = [ShardedLoader(loader, 3, r, train=False) for r in range(3)]
        seen = [[b.asnumpy()[:, 0].astype(int).tolist() for b in part] for part in parts]
        assert sorted(map(sorted, (b for s in seen for b in s))) == sorted(map(sorted, every))
    # A loader made with batch_size keeps its split of positions.
    plain = ShardedLoader(gluon.data.DataLoader(data, batch_size=8, shuffle=True), 2, 0, True)
    assert isinstance(plain.sampler, SplitSampler)
    assert plain.batch_positions(len(plain)) == (len(plain.sampler) - 8 * (len(plain) - 1), 16)


class Endless:
    def __len__(self):
        return 3

    def __iter__(self):
        return itertools.repeat([0, 1])


class NoLength:
    def __iter__(self):
        return iter([[0, 1]])


class SamplerNoLength(gluon.data.Sampler):
    """Gluon's own base class, whose __len__ raises NotImplementedError (a review found the
    traceback)."""

    def __iter__(self):
        return iter([[0, 1]])


@pytest.mark.parametrize("batch_sampler, says", [
    (Endless(), "whose epoch ends after len() batches"),
    (NoLength(), "give it a __len__"),
    (SamplerNoLength(), "give it a __len__"),
    (nlp.data.FixedBucketSampler(LENGTHS, 6, num_shards=2), "num_shards=0"),
    (gluon.data.BatchSampler(gluon.contrib.data.IntervalSampler(101, 3), 4, "rollover"),
     "use 'keep' or 'discard'"),
])
def test_a_batch_sampler_that_cannot_be_split_is_refused_in_one_line(batch_sampler, says):
    data = gluon.data.SimpleDataset(list(range(101)))
    loader = gluon.data.DataLoader(data, batch_sampler=batch_sampler)
    with pytest.raises(DatasetError) as refused:
        ShardedLoader(loader, 2, 0, train=True)
    assert says in str(refused.value) and "\n" not in str(refused.value)


class OwnShuffle(gluon.data.Sampler):
    """A sampler with a generator of its own, as a user writes one."""

    def __init__(self, length, seed):
        self._length, self._rng = length, np.random.RandomState(seed)

    def __iter__(self):
        return iter(self._rng.permutation(self._length).tolist())

    def __len__(self):
        return self._length


def test_a_sampler_with_its_own_generator_draws_another_order_each_epoch():
    """Each epoch is drawn from a copy of the sampler as given: its own RandomState is
    seeded from (seed, epoch), so epochs differ (before: the copy's generator drew the
    first epoch's order every epoch; issue 63, finding 9), and an epoch drawn again (a
    resume, another rank whose sampler was seeded otherwise) is the same."""
    def split(sampler_seed):
        sampler = gluon.data.BatchSampler(OwnShuffle(40, sampler_seed), 8)
        return BatchSplit(sampler, 40, seed=11)
    first, again = split(0), split(99)
    orders = []
    for epoch in range(3):
        first.set_epoch(epoch)
        again.set_epoch(epoch)
        orders.append(first.batches())
        assert first.batches() == again.batches()
        assert sorted(i for b in orders[-1] for i in b) == list(range(40))
    assert orders[0] != orders[1] != orders[2] != orders[0]
