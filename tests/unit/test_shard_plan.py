"""The sharded optimizer state's plan (store/shard_plan.py), its refusals, and its trainer on
one rank (the multi-rank runs: tests/dist/test_shard_optimizer.py)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from hvdtrain.config import ConfigError, RunConfig
from hvdtrain.store.shard_exchange import chunk_bounds
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


@pytest.mark.parametrize("ranks,size,per_rank,count", [
    (2, 576, 128, 3), (3, 1001, 100, 4), (7, 50, 3, 3), (2, 10, 64, 1),
    (3, 4, 1, 1)])  # slices of 2, 1, 1: one element each at most would leave one empty
def test_chunks_cut_every_slice_alike_and_cover_it_once(ranks, size, per_rank, count):
    """store/shard_exchange.py: every rank's slice cut into the same number of balanced,
    contiguous parts, none over the chunk's share of a rank, none empty."""
    bounds = shard_bounds(size, ranks)
    chunks = chunk_bounds(bounds, per_rank)
    assert len(chunks) == count and all(len(chunk) == ranks for chunk in chunks)
    for rank, (start, stop) in enumerate(bounds):
        parts = [chunk[rank] for chunk in chunks]
        assert parts[0][0] == start and parts[-1][1] == stop
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, in order
        lengths = [b - a for a, b in parts]
        assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1
        assert max(lengths) <= per_rank or count == min(b - a for a, b in bounds)


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
])
def test_combinations_not_sharded_yet_are_refused_in_one_line(changes, needle):
    with pytest.raises(ConfigError) as err:
        RunConfig(shard_optimizer=True, **changes)
    assert needle in str(err.value) and "--shard-optimizer" in str(err.value)
    assert "\n" not in str(err.value)


def _net():
    # One prefix for every instance: the Trainer orders parameters by name and a saved state
    # follows that order; counted names (dense99_, dense100_) sort apart as a test process
    # makes more nets (CI met it).
    net = gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(gluon.nn.Dense(7, in_units=5), gluon.nn.Dense(3, in_units=7))
    net.initialize(mx.init.Xavier())
    return net


@pytest.mark.parametrize("name", ["nadam", "lars", "ftrl", "adamax"])
def test_an_optimizer_not_per_element_is_refused(name):
    from hvdtrain.store.sharded import ShardedTrainer
    with pytest.raises(ConfigError, match="drop shard_optimizer"):
        ShardedTrainer(_net().collect_params(), name, {"learning_rate": 0.1},
                       bucket_mb=1.0)


def _trained(kind, name, start, x, y, steps, states=None, **options):
    """A copy of `start` trained `steps` steps by a trainer of `kind` (its states loaded from
    the file `states` first); (net, trainer)."""
    from hvdtrain.store.kvstore import HorovodKVStore
    net = _net()
    for mine, theirs in zip(net.collect_params().values(), start.collect_params().values()):
        mine.set_data(theirs.data())
    list(net.collect_params().values())[0].lr_mult = 0.3
    settings = {"learning_rate": 0.01, "wd": 0.01}
    if name == "sgd":
        settings["momentum"] = 0.9
    trainer = kind(net.collect_params(), name, settings, kvstore=HorovodKVStore(),
                   update_on_kvstore=False, **options)
    if states is not None:
        trainer.load_states(states)
    for _ in range(steps):
        with mx.autograd.record():
            loss = gluon.loss.L2Loss()(net(x), y)
        loss.backward()
        trainer.step(6)
    return net, trainer


def _weights(net):
    return [p.data().asnumpy() for p in net.collect_params().values()]


@pytest.mark.parametrize("name", ["adam", "lamb"])
def test_one_rank_updates_as_the_bucketed_trainer(name):
    """Alone, a rank's slice is every bucket: the same update as BucketedTrainer's (bit for
    bit with Adam; LAMB's norms are taken by other kernels than MXNet's fused
    multi_lamb_update), its state in the sharded updater; the replicated state's copies
    are refused."""
    from hvdtrain.store.buckets import BucketedTrainer
    from hvdtrain.store.sharded import ShardedTrainer
    x, y = mx.nd.random.normal(shape=(6, 5)), mx.nd.random.normal(shape=(6, 3))
    start = _net()
    results = [_weights(_trained(kind, name, start, x, y, 3, bucket_mb=1 / 8192)[0])
               for kind in (BucketedTrainer, ShardedTrainer)]
    _, trainer = _trained(ShardedTrainer, name, start, x, y, 1, bucket_mb=1 / 8192)
    for plain, sharded in zip(*results):
        if name == "adam":
            assert np.array_equal(plain, sharded)
        np.testing.assert_allclose(sharded, plain, rtol=1e-6, atol=1e-7)
    assert len(trainer.buckets) > 1 and trainer.state_bytes() == 2 * 4 * sum(
        a.size for a in results[1])
    with pytest.raises(NotImplementedError, match="call step"):
        trainer.allreduce_grads()
    with pytest.raises(NotImplementedError, match="shard_optimizer"):
        trainer._updaters[0].get_states(dump_optimizer=True)  # noqa


def test_the_whole_state_is_known_alone_until_the_next_update_then_only_gathered():
    """An elastic sync's rank 0 gives the whole state alone (no collective): the one its
    last commit gathered or a restore took, kept until the next update; after an update it
    refuses in one line rather than start a gather the other ranks never join."""
    import pickle
    from hvdtrain.store.gluon_internals import optimizer_states, set_optimizer_states
    from hvdtrain.store.sharded import ShardedTrainer
    x, y = mx.nd.random.normal(shape=(6, 5)), mx.nd.random.normal(shape=(6, 3))
    _, trainer = _trained(ShardedTrainer, "adam", _net(), x, y, 0, bucket_mb=1 / 8192)
    assert pickle.loads(optimizer_states(trainer, alone=True))[0] == {}  # nothing updated
    net, trainer = _trained(ShardedTrainer, "adam", _net(), x, y, 2, bucket_mb=1 / 8192)
    with pytest.raises(RuntimeError, match="cannot gather"):
        optimizer_states(trainer, alone=True)
    gathered = optimizer_states(trainer)  # every rank (here the only one)
    assert optimizer_states(trainer, alone=True) == gathered
    set_optimizer_states(trainer, gathered)  # a restore: taken, no slice cut yet
    assert optimizer_states(trainer, alone=True) == gathered
    with mx.autograd.record():
        loss = gluon.loss.L2Loss()(net(x), y)
    loss.backward()
    trainer.step(6)
    with pytest.raises(RuntimeError, match="cannot gather"):
        optimizer_states(trainer, alone=True)


def test_a_whole_state_taken_is_cut_for_the_ranks_there_are_at_the_next_step(monkeypatch):
    """After an elastic reset the same trainer finds other ranks: the whole state the sync
    gave it is cut into the slices of the new plan (rank 1 of 2: the second half of each
    bucket), and the plan's collectives are named as a joining worker's first plan."""
    from hvdtrain.store.gluon_internals import optimizer_states, set_optimizer_states
    from hvdtrain.store.sharded import ShardedTrainer
    import pickle
    x, y = mx.nd.random.normal(shape=(6, 5)), mx.nd.random.normal(shape=(6, 3))
    _, trainer = _trained(ShardedTrainer, "adam", _net(), x, y, 2, bucket_mb=1 / 8192)
    trainer.follow_gradients()
    whole = optimizer_states(trainer)
    set_optimizer_states(trainer, whole)
    monkeypatch.setattr(type(trainer), "_world", lambda self: (1, 2))
    trainer.replans = 3
    buckets = [flats[0] for flats in trainer._flat_grads]  # noqa
    trainer._settle()  # noqa  (what the next step does first)
    states = pickle.loads(whole)[0]
    assert trainer.replans == 0 and trainer._plan_suffix == ""  # noqa
    # The gradient buckets stay (a static graph writes into them): only the slices change.
    assert all(now[0] is then for now, then in zip(trainer._flat_grads, buckets))  # noqa
    cut = 0
    for bucket, pieces in zip(trainer.buckets, trainer.pieces):
        total = sum(trainer._params[i].data().size for i in bucket)  # noqa
        assert sum(p.size for p in pieces) == total // 2
        for piece in pieces:
            for mine, theirs in zip(_leaves(trainer.shard_updater.states[piece.param]),
                                    _leaves(states[piece.param])):
                assert np.array_equal(mine.asnumpy(),
                                      theirs.asnumpy().reshape(-1)[piece.start:piece.stop])
                cut += 1
    assert cut > 0


@pytest.mark.parametrize("name", ["sgd", "adam", "lamb"])
def test_the_saved_state_is_an_unsharded_trainers_and_resumes_both_ways(tmp_path, name):
    """A sharded trainer's ``save_states`` writes what an unsharded (bucketed) trainer's
    writes after the same steps: the same arrays per parameter, in its shape, and the same
    update counts; either file resumes either trainer to the same weights as three steps
    uninterrupted (bit for bit with Adam and SGD)."""
    import pickle
    from hvdtrain.store.buckets import BucketedTrainer
    from hvdtrain.store.sharded import ShardedTrainer
    x, y = mx.nd.random.normal(shape=(6, 5)), mx.nd.random.normal(shape=(6, 3))
    start = _net()
    files, after = {}, {}
    for kind in (BucketedTrainer, ShardedTrainer):
        net, trainer = _trained(kind, name, start, x, y, 2, bucket_mb=1 / 8192)
        files[kind] = str(tmp_path / kind.__name__)
        trainer.save_states(files[kind])
        after[kind] = _weights(net)
    (plain, plain_opt), (sharded, sharded_opt) = (
        pickle.loads(open(files[k], "rb").read()) for k in (BucketedTrainer, ShardedTrainer))
    assert sorted(plain) == sorted(sharded) == list(range(4))
    for index in plain:
        mine = [a for a in _leaves(sharded[index])]
        theirs = [a for a in _leaves(plain[index])]
        assert len(mine) == len(theirs) == {"sgd": 1}.get(name, 2)
        for a, b in zip(mine, theirs):
            assert a.shape == b.shape
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-7)
    assert sharded_opt._index_update_count == plain_opt._index_update_count  # noqa
    assert sharded_opt.num_update == plain_opt.num_update == 2
    whole = _weights(_trained(BucketedTrainer, name, start, x, y, 3, bucket_mb=1 / 8192)[0])
    for kind in (BucketedTrainer, ShardedTrainer):
        for source in (BucketedTrainer, ShardedTrainer):
            resumed_start = _net()
            for p, value in zip(resumed_start.collect_params().values(), after[source]):
                p.set_data(mx.nd.array(value))
            net, _ = _trained(kind, name, resumed_start, x, y, 1, states=files[source],
                              bucket_mb=1 / 8192)
            for got, want in zip(_weights(net), whole):
                if name != "lamb":
                    assert np.array_equal(got, want), (kind.__name__, source.__name__)
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _leaves(state):
    from hvdtrain.store.shard_checkpoint import leaves
    return [leaf for leaf in leaves(state) if leaf is not None]


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


def test_amps_loss_scaler_decides_from_the_slices():
    """AMP's own LossScaler on a sharded trainer: an update whose summed gradient holds an
    inf is skipped (the weights stay, the scale halves), as Gluon's Trainer skips it; a
    finite one is applied, divided by the loss scale."""
    from mxnet.contrib.amp.loss_scaler import LossScaler
    from hvdtrain.store.kvstore import HorovodKVStore
    from hvdtrain.store.sharded import ShardedTrainer
    net = _net()
    trainer = ShardedTrainer(net.collect_params(), "adam", {"learning_rate": 0.01},
                             kvstore=HorovodKVStore(), update_on_kvstore=False,
                             bucket_mb=1 / 8192)
    trainer._amp_loss_scaler = LossScaler()  # as amp.init_trainer sets it  # noqa
    trainer._amp_original_scale = trainer._scale  # noqa
    x, y = mx.nd.random.normal(shape=(6, 5)), mx.nd.random.normal(shape=(6, 3))
    weights = []
    for poison in (False, True, False):
        with mx.autograd.record():
            loss = gluon.loss.L2Loss()(net(x), y)
        loss.backward()
        if poison:
            list(net.collect_params().values())[1].grad()[0] = float("inf")
        before = _weights(net)
        trainer.step(6)
        weights.append((before, _weights(net)))
    assert all(not np.array_equal(a, b) for a, b in zip(*weights[0]))
    assert all(np.array_equal(a, b) for a, b in zip(*weights[1]))  # skipped
    assert all(not np.array_equal(a, b) for a, b in zip(*weights[2]))
    assert trainer._amp_loss_scaler.loss_scale == 2.0 ** 15  # noqa: halved once


def test_a_whole_state_of_another_model_is_refused_at_load():
    """The shapes are checked when the state is taken, on every rank alike, not at the first
    step by the rank whose slice meets the wrong one."""
    import pickle
    from hvdtrain.store.gluon_internals import optimizer_states, set_optimizer_states
    from hvdtrain.store.sharded import ShardedTrainer
    x, y = mx.nd.random.normal(shape=(6, 5)), mx.nd.random.normal(shape=(6, 3))
    _, trainer = _trained(ShardedTrainer, "adam", _net(), x, y, 1, bucket_mb=1 / 8192)
    states, optimizer = pickle.loads(optimizer_states(trainer))
    states[0], states[1] = states[1], states[0]  # another order of the parameters
    with pytest.raises(ValueError, match=r"parameter [01] has shape"):
        set_optimizer_states(trainer, pickle.dumps((states, optimizer)))
    states[7] = states[0]
    with pytest.raises(ValueError, match="names parameter 7"):
        set_optimizer_states(trainer, pickle.dumps(({7: states[7]}, optimizer)))


def test_a_gather_to_rank_0_sends_chunks_and_leaves_the_others_nothing():
    """store/shard_checkpoint.gather_whole as a save runs it (two ranks played in turn): the
    rank that only sends gives chunks of at most `chunk` elements and gets None; rank 0
    assembles the whole state from the chunks, every array as it was."""
    from hvdtrain.store.shard_checkpoint import gather_whole
    shapes, buckets, chunk = [(10, 7), (5,), (33,)], [[0], [1, 2]], 4
    rng = np.random.default_rng(0)
    whole = {i: (mx.nd.array(rng.normal(size=s)), mx.nd.array(rng.normal(size=s)))
             for i, s in enumerate(shapes)}
    sizes = [[int(np.prod(shapes[i])) for i in bucket] for bucket in buckets]
    plans = [plan_shards(buckets, sizes, rank, 2) for rank in (0, 1)]
    held = np.array([sum(any(p.param == i for b in plan for p in b) for plan in plans)
                     for i in range(len(shapes))], dtype=np.float32)

    def states_of(plan):
        return {p.param: tuple(a.reshape(-1)[p.start:p.stop] for a in whole[p.param])
                for bucket in plan for p in bucket}

    def template(index):
        return (mx.nd.zeros(1), mx.nd.zeros(1))

    sent = {}

    def send(vector, name):
        sent[name] = vector.copy()
        return None

    mine = gather_whole(buckets, shapes, plans[1], states_of(plans[1]), template, 1, 2,
                        send, lambda counts: held, chunk)
    assert mine is None and max(v.size for v in sent.values()) <= chunk

    def receive(vector, name):
        return np.concatenate([vector, sent[name]])

    got = gather_whole(buckets, shapes, plans[0], states_of(plans[0]), template, 0, 2,
                       receive, lambda counts: held, chunk)
    assert sorted(got) == sorted(whole)
    for i, arrays in whole.items():
        for a, b in zip(got[i], arrays):
            assert np.array_equal(a.asnumpy(), b.asnumpy())


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_a_streamed_states_file_is_the_pickle_mxnet_reads(tmp_path, dtype):
    """store/shard_states_file.py: the skeleton, then each array's data written in pieces
    and out of order, reads back with pickle (as Trainer.load_states reads it) as the
    arrays and optimizer it was written from; MXNet's header for each array is its own."""
    from hvdtrain.store.gluon_internals import raw_array_header
    from hvdtrain.store.shard_states_file import ArraySpace, GuardedFile, write_skeleton, \
        write_at
    rng = np.random.default_rng(1)
    real = {0: (rng.normal(size=(3, 4)), rng.normal(size=(3, 4))), 2: rng.normal(size=(5,)),
            4: None}
    real = {i: None if v is None else tuple(a.astype(dtype) for a in v)
            if isinstance(v, tuple) else v.astype(dtype) for i, v in real.items()}
    spaces = {0: (ArraySpace((3, 4), dtype), ArraySpace((3, 4), dtype)),
              2: ArraySpace((5,), dtype), 4: None}
    out = GuardedFile(str(tmp_path / "states.part"))
    write_skeleton(out, spaces, mx.optimizer.Adam(learning_rate=0.25))
    for array, space in ((real[2], spaces[2]), (real[0][1], spaces[0][1]),
                         (real[0][0], spaces[0][0])):
        flat = array.reshape(-1)
        write_at(out, space, 3, flat[3:])
        write_at(out, space, 0, flat[:3])
    written = out.close()
    written.move_to(str(tmp_path / "trainer.states"))
    import pickle
    states, optimizer = pickle.loads((tmp_path / "trainer.states").read_bytes())
    assert sorted(states) == [0, 2, 4] and states[4] is None
    assert optimizer.learning_rate == 0.25
    for got, want in zip(states[0] + (states[2],), real[0] + (real[2],)):
        assert got.dtype == np.dtype(dtype) and np.array_equal(got.asnumpy(), want)
    a = mx.nd.array(real[0][0], dtype=dtype)
    assert bytes(a.__getstate__()["handle"]) == raw_array_header((3, 4), dtype) + \
        real[0][0].tobytes()


def test_a_failed_streamed_write_is_raised_when_the_file_is_put_in_place(tmp_path):
    """The rank that streams goes on with the collectives after a failed write (nothing
    raised there); the failure is raised, as an OSError, where the save puts the file."""
    from hvdtrain.store.shard_states_file import ArraySpace, GuardedFile, write_skeleton
    out = GuardedFile(str(tmp_path / "missing" / "states.part"))  # no such folder
    write_skeleton(out, {0: ArraySpace((2,), "float32")}, None)
    with pytest.raises(OSError, match="could not be written"):
        out.close().move_to(str(tmp_path / "trainer.states"))
