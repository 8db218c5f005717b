"""GluonState, the elastic state: commit, restore and sync in one process.

The reference is always a second, independent net and trainer built the same way, trained
without the state object: a rollback to a commit followed by k steps must give exactly what
k steps from that commit give on a net that never saw the undone steps.
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.contrib.amp.loss_scaler import LossScaler

from hvdtrain.loop.elastic.state import GluonState
from hvdtrain.store.kvstore import HorovodKVStore
from hvdtrain.state.train_state import TrainState


def build(seed=3, optimizer="sgd", opt_params=None):
    """A small net with BatchNorm (running statistics are arrays to keep too)."""
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=5), gluon.nn.BatchNorm(in_channels=8),
            gluon.nn.Activation("relu"), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), optimizer,
                            opt_params or {"learning_rate": 0.1, "momentum": 0.9})
    return net, trainer


def batch(i):
    rng = np.random.RandomState(100 + i)
    return mx.nd.array(rng.rand(6, 5)), mx.nd.array(rng.randint(0, 3, 6))


def train(net, trainer, steps):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for i in steps:
        x, y = batch(i)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(6)
    mx.nd.waitall()


def arrays(net):
    # Named by place in the net (save_parameters' names): two nets built alike match.
    return {n: p.data().asnumpy() for n, p in net._collect_params_with_prefix().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def one_process(net, trainer, **kwargs):
    return GluonState(net, trainer, bcast_object=lambda obj, name: obj, get_rank=lambda: 0,
                      **kwargs)


@pytest.mark.parametrize("optimizer,opt_params", [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    ("adam", {"learning_rate": 0.01}),  # bias correction reads the optimizer's update count
])
def test_restore_undoes_the_steps_since_the_commit(optimizer, opt_params):
    net, trainer = build(optimizer=optimizer, opt_params=opt_params)
    reference, ref_trainer = build(optimizer=optimizer, opt_params=opt_params)
    train(net, trainer, range(3))
    train(reference, ref_trainer, range(3))

    state = one_process(net, trainer, position=TrainState(epoch=1, step=3, epoch_samples=18))
    state.commit()
    train(net, trainer, range(50, 54))  # the steps a failure undoes
    state.position.step, state.position.epoch_samples = 7, 42
    state.restore()

    assert state.position == TrainState(epoch=1, step=3, epoch_samples=18)
    assert_same(arrays(net), arrays(reference))
    # Momentum / Adam's moments and counts: the next steps agree only if they came back too.
    train(net, trainer, range(3, 6))
    train(reference, ref_trainer, range(3, 6))
    assert_same(arrays(net), arrays(reference))


def test_without_restore_the_undone_steps_show():
    """The test above would fail without the rollback: the undone steps change the arrays
    (the BatchNorm running statistics included)."""
    net, trainer = build()
    reference, _ = build()
    state = one_process(net, trainer)
    state.commit()
    train(net, trainer, range(50, 52))
    changed = [n for n, v in arrays(net).items()
               if not np.array_equal(v, arrays(reference)[n])]
    assert any("running_mean" in n for n in changed) and any("weight" in n for n in changed)
    state.restore()
    assert_same(arrays(net), arrays(reference))


def test_plain_values_and_loss_scale_roll_back():
    net, trainer = build()
    trainer._amp_loss_scaler = LossScaler()  # what amp.init_trainer attaches
    trainer._amp_loss_scaler._loss_scale = 2.0 ** 10
    state = one_process(net, trainer, resets=0)
    state.commit()
    state.resets = 5
    trainer._amp_loss_scaler._loss_scale = 2.0 ** 3
    state.restore()
    assert state.resets == 0 and trainer._amp_loss_scaler.loss_scale == 2.0 ** 10


def test_sync_makes_rank_zeros_commit_everyones():
    """A joining worker (other initial weights, no optimizer state) takes rank 0's net,
    optimizer and position: afterwards both train to identical arrays."""
    leader, leader_trainer = build(seed=3)
    train(leader, leader_trainer, range(3))
    leader_state = one_process(leader, leader_trainer, position=TrainState(epoch=2, step=3))

    joiner, joiner_trainer = build(seed=11)
    sent = {}

    def from_rank_zero(obj, name):
        # The leader's side of the broadcast is its own sync; keep what it sent by name.
        return sent.setdefault(name, obj)

    leader_state._bcast = from_rank_zero
    leader_state.sync()
    joiner_state = GluonState(joiner, joiner_trainer, bcast_object=from_rank_zero,
                              get_rank=lambda: 1)
    assert not np.array_equal(arrays(joiner)["0.weight"], arrays(leader)["0.weight"])
    joiner_state.sync()

    assert joiner_state.position == TrainState(epoch=2, step=3)
    assert_same(arrays(joiner), arrays(leader))
    train(joiner, joiner_trainer, range(3, 5))
    train(leader, leader_trainer, range(3, 5))
    assert_same(arrays(joiner), arrays(leader))


def test_only_rank_zero_copies_its_state_for_a_sync():
    """A sync's other ranks send nothing (their side is ignored): copying their own state
    first held it once more on them while they received rank 0's (issue 35, defect 9)."""
    leader, leader_trainer = build(seed=3)
    joiner, joiner_trainer = build(seed=11)
    sent = {}

    def from_rank_zero(obj, name):
        sent.setdefault(name, []).append(obj)
        return sent[name][0]

    leader_state = GluonState(leader, leader_trainer, bcast_object=from_rank_zero,
                              get_rank=lambda: 0)
    joiner_state = GluonState(joiner, joiner_trainer, bcast_object=from_rank_zero,
                              get_rank=lambda: 1)
    leader_state.sync()
    joiner_state.sync()
    leaders, joiners = sent["hvdtrain.elastic.model"]
    assert leaders is not None and joiners is None
    assert joiner_state._saved_arrays is leaders[0]  # pylint: disable=protected-access
    assert_same(arrays(joiner), arrays(leader))


def test_a_trainer_that_updates_on_the_store_is_refused():
    net, trainer = build()
    trainer._update_on_kvstore = True
    with pytest.raises(ValueError, match="update_on_kvstore=False"):
        one_process(net, trainer)


def test_after_a_sync_the_first_step_broadcasts_nothing():
    """A trainer with a store broadcasts every parameter on its first step; a worker that
    joins a running job must not (the others are past theirs: it would wait alone)."""
    store = HorovodKVStore()  # one process: hvd.init() of size 1
    broadcasts = []
    original = store.broadcast
    store.broadcast = lambda *a, **k: (broadcasts.append(a[0]), original(*a, **k))
    net, _ = build()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore=store, update_on_kvstore=False)
    state = one_process(net, trainer)
    state.sync()
    train(net, trainer, range(1))
    assert broadcasts == []

    # Without the sync the same trainer does broadcast: the check above can fail.
    net, _ = build()
    plain = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                          kvstore=store, update_on_kvstore=False)
    train(net, plain, range(1))
    assert broadcasts


def test_a_store_that_registers_keys_is_refused():
    """MXNet's own stores register each key at the first step's broadcast: skipping it
    (as a sync does) would break them, and they are never elastic anyway."""
    net, _ = build()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore=mx.kv.create("local"), update_on_kvstore=False)
    with pytest.raises(ValueError, match="Horovod store"):
        one_process(net, trainer)


def test_a_commit_that_fails_inside_its_gather_leaves_the_last_commit_whole(monkeypatch):
    """A peer lost inside a commit's gather of the optimizer state (a sharded trainer's: a
    collective) leaves the previous commit whole: a restore gives the weights, optimizer
    state and position of that commit together, never this step's weights beside the last
    commit's optimizer state (issue 63, finding 1)."""
    from hvdtrain.loop.elastic import state as state_mod
    net, trainer = build()
    train(net, trainer, range(2))
    kept = one_process(net, trainer, position=TrainState(epoch=0, step=2))
    committed = arrays(net)
    train(net, trainer, range(2, 4))
    kept.position = TrainState(epoch=0, step=4)

    def lost_peer(*args, **kwargs):
        raise RuntimeError("Horovod has been shut down")
    monkeypatch.setattr(state_mod, "optimizer_states", lost_peer)
    with pytest.raises(RuntimeError):
        kept.commit()
    monkeypatch.undo()
    kept.restore()
    assert_same(arrays(net), committed)
    assert kept.position.step == 2
    reference, ref_trainer = build()
    train(reference, ref_trainer, range(2))
    train(reference, ref_trainer, range(4, 5))
    train(net, trainer, range(4, 5))
    assert_same(arrays(net), arrays(reference))


def test_the_fault_switch_fails_a_commit_between_its_weights_and_its_gather(monkeypatch):
    """``HVDTRAIN_FAULT_AT=elastic.commit:<rank>`` fails a commit where a lost peer would
    (after the weights are copied, before the optimizer state's gather): the previous
    commit stays whole."""
    from hvdtrain.store import agree as agree_mod
    from hvdtrain.store.agree import FaultInjected
    net, trainer = build()
    kept = one_process(net, trainer, position=TrainState(epoch=0, step=0))
    committed = arrays(net)
    train(net, trainer, range(2))
    monkeypatch.setattr(agree_mod, "_FAULT_CALLS", {})
    monkeypatch.setenv("HVDTRAIN_FAULT_AT", "elastic.commit:0")
    with pytest.raises(FaultInjected, match="fault injected at elastic.commit on rank 0"):
        kept.commit()
    monkeypatch.delenv("HVDTRAIN_FAULT_AT")
    kept.restore()
    assert_same(arrays(net), committed)
