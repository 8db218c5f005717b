"""Bucketed gradient exchange: the plan, and the calls the Trainer makes with it."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain.exchange import MIB, BucketedTrainer, plan_buckets
from hvdtrain.kvstore import HorovodKVStore


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
    # Three steps, each one call per bucket with that bucket's keys.
    assert store.calls == [list(b) for b in trainer.buckets] * 3
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
