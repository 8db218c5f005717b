"""Bucketed gradient exchange: the plan, and the calls the Trainer makes with it."""
import mxnet as mx
import numpy as np
import pytest
from helpers import assert_arrays_close
from mxnet import autograd, gluon

from hvdtrain.store.buckets import MIB, BucketedTrainer, plan_buckets
from hvdtrain.store.kvstore import HorovodKVStore


def test_plan_keeps_one_dtype_per_bucket():
    f32, f16 = np.dtype("float32"), np.dtype("float16")
    assert plan_buckets([4, 4, 2, 2], 100, [f32, f32, f16, f16]) == [[3, 2], [1, 0]]
    assert plan_buckets([4, 2, 4], 100, [f32, f16, f32]) == [[2], [1], [0]]


def test_plan_starts_from_the_last_parameter_and_respects_the_cap():
    assert plan_buckets([4, 4, 4, 10, 2], 8) == [[4], [3], [2, 1], [0]]
    assert plan_buckets([4, 4, 4], 12) == [[2, 1, 0]]
    assert plan_buckets([4, 4, 4], 0) == [[2], [1], [0]]
    assert plan_buckets([], 8) == []


@pytest.mark.parametrize("cap", [1, 50, 10**6])
def test_plan_covers_every_parameter_once(cap):
    sizes = list(np.random.RandomState(cap).randint(1, 100, size=40))
    buckets = plan_buckets(sizes, cap)
    assert sorted(i for b in buckets for i in b) == list(range(40))
    assert all(len(b) == 1 or sum(sizes[i] for i in b) <= cap for b in buckets)


class RecordingStore(HorovodKVStore):
    """The Horovod store (one rank), noting the keys of every pushpull."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def pushpull(self, key, value, out=None, priority=0):
        self.calls.append(key)
        super().pushpull(key, value, out=out, priority=priority)


def net_and_data():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.BatchNorm(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(8, 32))
    net(x)
    return net, x, mx.nd.array(np.arange(8) % 10)


def train_steps(trainer, net, x, y, steps=3):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(len(y))
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()}


def fresh(net, params):
    for name, p in net.collect_params().items():
        p.set_data(mx.nd.array(params[name]))


@pytest.mark.parametrize("bucket_mb", [0.01, 25])
def test_trainer_reduces_every_gradient_in_its_buckets(bucket_mb):
    net, x, y = net_and_data()
    start = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    store = RecordingStore()
    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1,
                                                            "momentum": 0.9},
                              kvstore=store, update_on_kvstore=False, bucket_mb=bucket_mb)
    assert trainer.buckets == []  # no plan before the store is set up at the first step
    bucketed = train_steps(trainer, net, x, y)
    params = trainer._params  # pylint: disable=protected-access  (the Trainer's key order)
    with_grad = [i for i, p in enumerate(params) if p.grad_req != "null"]
    assert sorted(i for b in trainer.buckets for i in b) == with_grad
    assert trainer.buckets[0][0] == with_grad[-1]  # the first gradient backward computes
    assert all(sum(params[i].data().size * 4 for i in b) <= bucket_mb * MIB
               for b in trainer.buckets if len(b) > 1)
    # Three steps, each one in-place call per bucket, named by the bucket's first parameter.
    assert store.calls == [f"bucket.{b[0]}" for b in trainer.buckets] * 3
    if bucket_mb == 25:
        assert len(trainer.buckets) == 1

    fresh(net, start)
    plain = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                          kvstore=RecordingStore(), update_on_kvstore=False)
    expected = train_steps(plain, net, x, y)
    for name, value in expected.items():
        np.testing.assert_array_equal(bucketed[name], value)


def test_zero_bucket_size_keeps_one_call_per_parameter():
    net, x, y = net_and_data()
    store = RecordingStore()
    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                              kvstore=store, update_on_kvstore=False, bucket_mb=0)
    train_steps(trainer, net, x, y, steps=1)
    assert trainer.buckets == []
    with_grad = [i for i, p in enumerate(trainer._params)  # pylint: disable=protected-access
                 if p.grad_req != "null"]
    assert len(with_grad) == 6  # BatchNorm's running statistics have no gradient
    assert store.calls == with_grad


def test_stores_that_cannot_group_keep_the_trainers_exchange():
    net, x, y = net_and_data()
    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                              kvstore=mx.kv.create("local"), update_on_kvstore=False,
                              bucket_mb=25)
    train_steps(trainer, net, x, y, steps=1)
    assert trainer.buckets == []


def _writes_through(flat, view):
    """Whether writing `flat` shows through `view` (so backward's writes reach `flat`).
    It overwrites both: call it after the figures are read."""
    flat[:] = 7.0
    return bool(np.all(view.asnumpy() == 7.0))


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("before_first_step", [False, True])
def test_gradients_are_views_into_one_flat_buffer(hybridize, before_first_step):
    """Zero-copy buckets: each gradient is a slice of its bucket's flat buffer, backward
    writes through it (imperative and static_alloc graphs), and training matches the
    Trainer's own per-parameter exchange."""
    net, x, y = net_and_data()
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    start = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1,
                                                            "momentum": 0.9},
                              kvstore=RecordingStore(), update_on_kvstore=False,
                              bucket_mb=0.01)
    if before_first_step:  # as hvdtrain's broadcast_parameters does
        trainer._init_kvstore()  # pylint: disable=protected-access
    bucketed = train_steps(trainer, net, x, y)
    fresh(net, start)
    plain = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                          kvstore=RecordingStore(), update_on_kvstore=False)
    expected = train_steps(plain, net, x, y)
    for name, value in expected.items():
        assert_arrays_close(bucketed[name], value, 1e-6, what=name)  # rounding only

    params = trainer._params  # pylint: disable=protected-access
    assert len(trainer.buckets) > 1
    for bucket, (flat,) in zip(trainer.buckets, trainer._flat_grads):  # pylint: disable=protected-access
        assert flat.size == sum(params[i].data().size for i in bucket)
        assert all(_writes_through(flat, params[i].grad()) for i in bucket)


def test_several_devices_each_get_a_flat_buffer():
    devices = [mx.cpu(0), mx.cpu(1)]
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=32), gluon.nn.Dense(10, in_units=16))
    net.initialize(mx.init.Xavier(), ctx=devices)
    x, y = mx.nd.random.uniform(shape=(8, 32)), mx.nd.array(np.arange(8) % 10)
    start = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def steps(trainer):
        for _ in range(3):
            with autograd.record():
                losses = [loss_fn(net(xs), ys) for xs, ys in
                          zip(gluon.utils.split_and_load(x, devices),
                              gluon.utils.split_and_load(y, devices))]
            autograd.backward(losses)
            trainer.step(len(y))
        return {name: p.data(devices[1]).asnumpy() for name, p in net.collect_params().items()}

    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                              kvstore=RecordingStore(), update_on_kvstore=False, bucket_mb=25)
    bucketed = steps(trainer)
    assert [f.context for f in trainer._flat_grads[0]] == devices  # pylint: disable=protected-access
    for name, p in net.collect_params().items():
        p.set_data(mx.nd.array(start[name]))
    expected = steps(gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                   kvstore=RecordingStore(), update_on_kvstore=False))
    for name, value in expected.items():
        assert_arrays_close(bucketed[name], value, 1e-6, what=name)  # rounding only
