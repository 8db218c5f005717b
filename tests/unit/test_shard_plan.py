"""The sharded optimizer state's plan (store/shard_plan.py), its refusals, and its trainer on
one rank (the multi-rank runs: tests/dist/test_shard_optimizer.py)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from hvdtrain.config import ConfigError, RunConfig
from hvdtrain.store.shard_plan import Piece, plan_shards, shard_bounds, slice_pieces


@pytest.mark.parametrize("ranks", [1, 2, 3, 7])
@pytest.mark.parametrize("size", [0, 1, 2, 6, 7, 100, 1001])
def test_slices_are_balanced_and_cover_every_element_once(size, ranks):
    bounds = shard_bounds(size, ranks)
    assert len(bounds) == ranks
    lengths = [stop - start for start, stop in bounds]
    assert max(lengths) - min(lengths) <= 1  # balanced within one element
    owner = np.full(size, -1)
    for rank, (start, stop) in enumerate(bounds):
        assert (owner[start:stop] == -1).all()  # nobody owns it yet
        owner[start:stop] = rank
    assert (owner >= 0).all()  # every element owned
    assert list(owner) == sorted(owner)  # contiguous, in rank order


def test_slices_follow_horovods_reducescatter_split():
    """Horovod 0.28.1 gives the first size % N ranks one element more (checked under
    mpirun: 7 elements over 3 ranks arrive as 3, 2, 2)."""
    assert shard_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert shard_bounds(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert shard_bounds(1, 3) == [(0, 1), (1, 1), (1, 1)]


@pytest.mark.parametrize("ranks", [2, 3, 7])
def test_pieces_of_a_bucket_cover_each_parameter_once(ranks):
    params, sizes = [4, 9, 2, 5], [10, 3, 25, 1]  # Trainer positions, elements
    plan = plan_shards([params], [sizes], 0, ranks)  # shape of the result
    assert len(plan) == 1
    seen = {p: np.zeros(s, int) for p, s in zip(params, sizes)}
    for rank in range(ranks):
        pieces = plan_shards([params], [sizes], rank, ranks)[0]
        start, stop = shard_bounds(sum(sizes), ranks)[rank]
        assert sum(p.size for p in pieces) == stop - start  # the slice, whole
        offset = 0
        for piece in pieces:  # laid out in the slice in order, one per parameter
            assert piece.offset == offset and piece.size > 0
            offset += piece.size
            seen[piece.param][piece.start:piece.stop] += 1
        assert len({p.param for p in pieces}) == len(pieces)
    assert all((count == 1).all() for count in seen.values())


def test_a_slice_cut_inside_and_across_parameters():
    # Parameters of 4, 6 and 5 elements; the slice [2, 12) takes the last 2 of the first,
    # the whole second and the first 2 of the third.
    assert slice_pieces([0, 1, 2], [4, 6, 5], 2, 12) == [
        Piece(0, 2, 4, 0), Piece(1, 0, 6, 2), Piece(2, 0, 2, 8)]
    assert slice_pieces([0, 1], [4, 6], 4, 4) == []


@pytest.mark.parametrize("changes,needle", [
    (dict(kvstore="local"), "--kvstore local"),
    (dict(grad_bucket_mb=0.0), "--grad-bucket-mb 0"),
    (dict(compression="powersgd"), "--compression powersgd"),
    (dict(fp16_allreduce=True), "--fp16-allreduce"),
    (dict(amp=True), "--amp"),
    (dict(accumulate=2), "--accumulate"),
    (dict(clip_grad_norm=1.0), "--clip-grad-norm"),
    (dict(ema=0.9), "--ema"),
    (dict(elastic=True), "--elastic"),
    (dict(output_dir="/tmp/run"), "--output-dir"),
])
def test_combinations_not_sharded_yet_are_refused_in_one_line(changes, needle):
    with pytest.raises(ConfigError) as err:
        RunConfig(shard_optimizer=True, **changes)
    assert needle in str(err.value) and "--shard-optimizer" in str(err.value)
    assert "\n" not in str(err.value)


def _net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(7, in_units=5), gluon.nn.Dense(3, in_units=7))
    net.initialize(mx.init.Xavier())
    return net


@pytest.mark.parametrize("name", ["nadam", "lars", "ftrl", "adamax"])
def test_an_optimizer_not_per_element_is_refused(name):
    from hvdtrain.store.sharded import ShardedTrainer
    with pytest.raises(ConfigError, match="drop shard_optimizer"):
        ShardedTrainer(_net().collect_params(), name, {"learning_rate": 0.1},
                       bucket_mb=1.0)


@pytest.mark.parametrize("name", ["adam", "lamb"])
def test_one_rank_updates_as_the_bucketed_trainer_and_refuses_to_save(tmp_path, name):
    """Alone, a rank's slice is every bucket: the same update as BucketedTrainer's (bit for
    bit with Adam; LAMB's norms are taken by other kernels than MXNet's fused
    multi_lamb_update), its state in the sharded updater; saving or loading the whole state
    is refused."""
    from hvdtrain.store.buckets import BucketedTrainer
    from hvdtrain.store.kvstore import HorovodKVStore
    from hvdtrain.store.sharded import ShardedTrainer
    store = HorovodKVStore()  # one process: hvd.init() of size 1
    x, y = mx.nd.random.normal(shape=(6, 5)), mx.nd.random.normal(shape=(6, 3))
    start = _net()
    results = []
    for kind in (BucketedTrainer, ShardedTrainer):
        net = _net()
        for mine, theirs in zip(net.collect_params().values(),
                                start.collect_params().values()):
            mine.set_data(theirs.data())
        list(net.collect_params().values())[0].lr_mult = 0.3
        trainer = kind(net.collect_params(), name, {"learning_rate": 0.01, "wd": 0.01},
                       kvstore=store, update_on_kvstore=False, bucket_mb=1 / 8192)
        for _ in range(3):
            with mx.autograd.record():
                loss = gluon.loss.L2Loss()(net(x), y)
            loss.backward()
            trainer.step(6)
        results.append([p.data().asnumpy() for p in net.collect_params().values()])
    for plain, sharded in zip(*results):
        if name == "adam":
            assert np.array_equal(plain, sharded)
        np.testing.assert_allclose(sharded, plain, rtol=1e-6, atol=1e-7)
    assert len(trainer.buckets) > 1 and trainer.state_bytes() == 2 * 4 * sum(
        a.size for a in results[1])
    with pytest.raises(NotImplementedError, match="shard_optimizer"):
        trainer.save_states(str(tmp_path / "states"))
    with pytest.raises(NotImplementedError, match="call step"):
        trainer.allreduce_grads()
    from hvdtrain.store.gluon_internals import optimizer_states_later
    with pytest.raises(NotImplementedError, match="shard_optimizer"):
        optimizer_states_later(trainer)


@pytest.mark.parametrize("on", [False, True])
def test_run_trainer_shards_only_when_asked(on):
    from hvdtrain.loop.engine.trainer import distributed_trainer, run_trainer
    from hvdtrain.store.dist import DistContext
    from hvdtrain.store.kvstore import HorovodKVStore
    from hvdtrain.store.sharded import ShardedTrainer
    dist = DistContext.from_store(HorovodKVStore())
    cfg = RunConfig(shard_optimizer=on)
    net = _net()
    trainer = run_trainer(net, list(net.collect_params().values()), "adam", None, cfg, dist)
    assert isinstance(trainer, ShardedTrainer) == on
    # A trainer of the other kind given to the Estimator is rebuilt as the option says.
    other = RunConfig(shard_optimizer=not on)
    assert isinstance(distributed_trainer(trainer, net, other, dist), ShardedTrainer) != on
