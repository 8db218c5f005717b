import numpy as np
import pytest

from hvdtrain.data.sampler import SplitSampler


def parts(length, num_parts, **kw):
    return [SplitSampler(length, num_parts, i, **kw).indices() for i in range(num_parts)]


@pytest.mark.parametrize("mode", ["strided", "contiguous"])
@pytest.mark.parametrize("length,num_parts", [(1001, 3), (10, 4), (7, 7), (5, 8), (12, 3)])
def test_parts_equal_cover_and_overlap_only_by_padding(mode, length, num_parts):
    split = parts(length, num_parts, shuffle=True, seed=3, mode=mode)
    sizes = {len(p) for p in split}
    assert sizes == {-(-length // num_parts)}
    assert all(len(SplitSampler(length, num_parts, i, mode=mode)) == len(p)
               for i, p in enumerate(split))
    everything = np.concatenate(split)
    assert set(everything.tolist()) == set(range(length))
    padding = len(everything) - length
    assert padding < num_parts
    _, counts = np.unique(everything, return_counts=True)
    assert counts.sum() - len(counts) == padding  # only the padded samples repeat


def test_1001_on_3_parts():
    split = parts(1001, 3, shuffle=True, seed=0)
    assert [len(p) for p in split] == [334, 334, 334]
    assert len(set(np.concatenate(split).tolist())) == 1001


def test_same_shuffle_on_every_rank_and_new_one_each_epoch():
    a, b = SplitSampler(100, 2, 0, shuffle=True, seed=7), SplitSampler(100, 2, 0, shuffle=True,
                                                                         seed=7)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(SplitSampler(100, 2, 0, shuffle=True, seed=8)) != first


def test_no_shuffle_keeps_order():
    assert list(SplitSampler(6, 2, 1, shuffle=False)) == [1, 3, 5]
    assert list(SplitSampler(6, 2, 1, shuffle=False, mode="contiguous")) == [3, 4, 5]


@pytest.mark.parametrize("num_workers,batch", [(2, 8), (3, 5), (4, 4)])
def test_strided_workers_see_the_single_workers_batches(num_workers, batch):
    length = 200
    single = SplitSampler(length, 1, 0, shuffle=True, seed=1).indices()
    workers = [SplitSampler(length, num_workers, r, shuffle=True, seed=1).indices()
               for r in range(num_workers)]
    global_batch = num_workers * batch
    steps = length // global_batch
    for step in range(steps):
        together = np.concatenate([w[step * batch:(step + 1) * batch] for w in workers])
        expected = single[step * global_batch:(step + 1) * global_batch]
        assert sorted(together.tolist()) == sorted(expected.tolist())


def test_unpadded_parts_cover_each_sample_once():
    split = parts(10, 4, pad=False)
    assert sorted(np.concatenate(split).tolist()) == list(range(10))
    assert [len(p) for p in split] == [3, 3, 2, 2]
    assert [len(SplitSampler(10, 4, i, pad=False)) for i in range(4)] == [3, 3, 2, 2]


@pytest.mark.parametrize("kwargs", [dict(length=0), dict(length=5, num_parts=0),
                                    dict(length=5, num_parts=2, part_index=2),
                                    dict(length=5, mode="random")])
def test_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        SplitSampler(**kwargs)


@pytest.mark.parametrize("mode", ["strided", "contiguous"])
@pytest.mark.parametrize("length,num_parts,batch,done", [(1437, 2, 64, 5), (100, 3, 4, 7),
                                                         (10, 4, 1, 1)])
def test_resumed_epoch_yields_the_rest_of_the_same_epoch(mode, length, num_parts, batch, done):
    """Skipping `done` steps' samples leaves, on every part, exactly the batches an
    uninterrupted epoch runs after them (padding included)."""
    processed = done * batch * num_parts
    for part in range(num_parts):
        whole = SplitSampler(length, num_parts, part, shuffle=True, seed=5, mode=mode)
        whole.set_epoch(3)
        rest = SplitSampler(length, num_parts, part, shuffle=True, seed=5, mode=mode)
        rest.set_epoch(3, processed)
        assert list(rest) == list(whole)[done * batch:]
        assert len(rest) == len(whole) - done * batch


def test_resumed_epoch_on_other_worker_counts_covers_the_rest_once():
    """Stopped on 2 workers, resumed on 3: the untrained samples, each once (plus padding)."""
    order = SplitSampler(50, 1, 0, shuffle=True, seed=2).indices()
    rest = [SplitSampler(50, 3, r, shuffle=True, seed=2) for r in range(3)]
    for sampler in rest:
        sampler.set_epoch(0, 20)
    seen = np.concatenate([s.indices() for s in rest])
    assert set(seen.tolist()) == set(order[20:].tolist())
    assert len(seen) == 30  # 30 left: divisible by 3, no padding
    with pytest.raises(ValueError):
        rest[0].set_epoch(0, 50)
