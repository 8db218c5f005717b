"""An elastic rollback mid-accumulation keeps nothing of the undone attempt (issue 35, 7).

With ``--accumulate`` N > 1 the gradients sum over N micro-batches (``grad_req='add'``). A
peer lost between two micro-batches rolls the survivors back to the last commit; the step
they redo must not add the micro-batches already summed. Horovod's own elastic loop
(``run_fn``: sync, fail, restore, reset, sync, again) drives a :class:`GluonState` here, in
one process. The reference is a plain ``gluon.Trainer`` without a store that never failed,
not hybridized, with no elastic state: it trains the same micro-batches once each.
"""
import mxnet as mx
import numpy as np
import pytest
from horovod.common.elastic import run_fn
from horovod.common.exceptions import HorovodInternalError
from mxnet import autograd, gluon

from hvdtrain.loop.elastic.state import GluonState
from hvdtrain.runtime.elastic_run import drain_engine
from hvdtrain.state.train_state import TrainState
from hvdtrain.store.buckets import BucketedTrainer
from hvdtrain.store.gluon_internals import set_up_store
from hvdtrain.store.kvstore import HorovodKVStore

ACCUMULATE, BATCH, STEPS, COMMIT_EVERY = 2, 6, 4, 2
FAIL_AT = (3, 1)  # (step, micro-batch): the second micro-batch of the fourth step


def build_net():
    mx.random.seed(5)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=5), gluon.nn.BatchNorm(in_channels=8),
            gluon.nn.Activation("relu"), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    for param in net.collect_params().values():
        if param.grad_req != "null":
            param.grad_req = "add"  # what --accumulate sets (loop/engine/batches.py)
    return net


def micro_batch(step, k):
    rng = np.random.RandomState(1000 + step * ACCUMULATE + k)
    return mx.nd.array(rng.rand(BATCH, 5)), mx.nd.array(rng.randint(0, 3, BATCH))


def backward(net, step, k):
    x, y = micro_batch(step, k)
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()


def reference_arrays():
    """Plain Gluon accumulation: each step's micro-batches once, one update, zero_grad."""
    net = build_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    for step in range(STEPS):
        for k in range(ACCUMULATE):
            backward(net, step, k)
        trainer.step(ACCUMULATE * BATCH)
        net.collect_params().zero_grad()
    return arrays(net)


def arrays(net):
    return {n: p.data().asnumpy() for n, p in net._collect_params_with_prefix().items()}


def elastic_trainer(kind, net):
    """The trainer under test: Gluon's own, or hvdtrain's buckets on a one-process Horovod
    store, set up before the first backward (gradients are views into the flat buffers) or
    after a static_alloc graph ran backward (that graph keeps writing its own arrays)."""
    opt = ("sgd", {"learning_rate": 0.1, "momentum": 0.9})
    if kind == "gluon":
        return gluon.Trainer(net.collect_params(), *opt, kvstore=None)
    trainer = BucketedTrainer(net.collect_params(), *opt, kvstore=HorovodKVStore(),
                              update_on_kvstore=False, bucket_mb=1)
    net.hybridize(static_alloc=True, static_shape=True)
    if kind == "buckets":
        set_up_store(trainer, ACCUMULATE * BATCH)
    else:  # "buckets, static graph": the graph binds its arrays before the buckets exist
        with autograd.record(train_mode=False):
            zero = net(micro_batch(0, 0)[0]).sum() * 0
        autograd.backward([zero], train_mode=False)
    return trainer


def train_with_one_failure(kind):
    net = build_net()
    trainer = elastic_trainer(kind, net)
    state = GluonState(net, trainer, TrainState(), bcast_object=lambda obj, name: obj,
                       get_rank=lambda: 0)
    failed = []

    def train(state):  # as loop/engine/epoch.py steps, a commit every COMMIT_EVERY steps
        while state.position.step < STEPS:
            step = state.position.step
            for k in range(ACCUMULATE):
                backward(net, step, k)
                if (step, k) == FAIL_AT and not failed:
                    failed.append(step)
                    raise HorovodInternalError("a peer was lost mid-accumulation")
            trainer.step(ACCUMULATE * BATCH)
            net.collect_params().zero_grad()  # loop/engine/batches.py's clear_gradients
            state.position.step += 1
            if state.position.step % COMMIT_EVERY == 0:
                state.commit()

    run_fn(train, reset=lambda: None)(state)  # one process: no Horovod to restart
    return net, trainer, state, failed


@pytest.mark.parametrize("kind", ["gluon", "buckets", "buckets, static graph"])
def test_a_rollback_mid_accumulation_trains_as_a_run_that_never_failed(kind):
    net, trainer, state, failed = train_with_one_failure(kind)
    assert failed == [FAIL_AT[0]] and state.position.step == STEPS
    reference = reference_arrays()
    got = arrays(net)
    assert got.keys() == reference.keys()
    for name in reference:
        np.testing.assert_allclose(got[name], reference[name], rtol=1e-6, atol=1e-6,
                                   err_msg=name)
    if kind != "gluon":
        # The gradients stayed in their buckets (zeroed in place, never re-created), and
        # the static graph's own arrays were in play, as the case intends.
        assert trainer.replans == 0 and trainer.buckets
        assert (trainer.copied_gradients > 0) == (kind == "buckets, static graph")


def test_a_rollback_writes_back_arrays_a_failed_collective_left_marked():
    """Two collectives fail; the wait that raises the first (turned into the rollback)
    leaves the second's failure on the gradient it should have reduced and on the weight its
    update read it into. MXNet's engine skips writes to such arrays until it is drained, so
    the restore that Horovod's run_fn calls before the reset must drain it first, or the
    sync after the reset commits the failed attempt's weight as rank 0's state."""
    net = build_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    state = GluonState(net, trainer, TrainState(), bcast_object=lambda obj, name: obj,
                       get_rank=lambda: 0)
    failed = []

    def train(state):
        while state.position.step < STEPS:
            step = state.position.step
            for k in range(ACCUMULATE):
                backward(net, step, k)
            if step == FAIL_AT[0] and not failed:  # a step after the last commit
                # The second failed allreduce: an engine operation that fails writing the
                # gradient (a negative scale), queued like Horovod's, never waited for.
                grad = net[0].weight.grad()
                mx.nd.random.normal(0, -1, shape=grad.shape, out=grad)
                trainer.step(ACCUMULATE * BATCH)  # its update is skipped: weight marked
                failed.append(step)
                raise HorovodInternalError("the first failed allreduce, raised by a wait")
            trainer.step(ACCUMULATE * BATCH)
            net.collect_params().zero_grad()
            state.position.step += 1
            if state.position.step % COMMIT_EVERY == 0:
                state.commit()

    run_fn(train, reset=drain_engine)(state)  # the real reset less Horovod's restart
    assert failed == [FAIL_AT[0]] and state.position.step == STEPS
    reference = reference_arrays()
    got = arrays(net)
    for name in reference:
        np.testing.assert_allclose(got[name], reference[name], rtol=1e-6, atol=1e-6,
                                   err_msg=name)
