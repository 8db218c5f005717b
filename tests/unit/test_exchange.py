"""Bucketed gradient exchange: the plan, and the calls the Trainer makes with it."""
import logging

import mxnet as mx
import numpy as np
import pytest
from helpers import assert_arrays_close
from mxnet import autograd, gluon
from mxnet.gluon.model_zoo import vision

from hvdtrain.store.buckets import MIB, BucketedTrainer, plan_buckets
from hvdtrain.store.kvstore import HorovodKVStore


def test_plan_keeps_one_dtype_per_bucket():
    f32, f16 = np.dtype("float32"), np.dtype("float16")
    assert plan_buckets([4, 4, 2, 2], 100, [f32, f32, f16, f16]) == [[3, 2], [1, 0]]
    # Each dtype fills a bucket of its own: alternating dtypes do not split every bucket.
    assert plan_buckets([4, 2, 4, 2, 4], 100, [f32, f16, f32, f16, f32]) == [[4, 2, 0], [3, 1]]
    assert plan_buckets([4, 2, 4, 2, 4], 8, [f32, f16, f32, f16, f32]) == [[4, 2], [3, 1], [0]]


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


def build_net(hybridize=None):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.BatchNorm(), gluon.nn.Dense(10))
    if hybridize is not None:
        net.hybridize(**hybridize)
    return net


def twin_nets(tmp_path, hybridize=None):
    """Two nets built separately, starting from the same parameters (saved by the first,
    loaded by the second): the second is the independent reference for the first."""
    first = build_net(hybridize)
    first.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(8, 32))
    with autograd.train_mode():
        first(x)
    first.save_parameters(str(tmp_path / "start.params"))
    second = build_net(hybridize)
    second.load_parameters(str(tmp_path / "start.params"))
    return first, second, x, mx.nd.array(np.arange(8) % 10)


def train_steps(trainer, net, x, y, steps=3):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(len(y))
    mx.nd.waitall()  # static_alloc: BatchNorm's statistics are written untracked
    return [p.data().asnumpy() for p in net.collect_params().values()]


def plain_trainer(net, **opt):
    return gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, **opt},
                         kvstore=RecordingStore(), update_on_kvstore=False)


def assert_same_training(bucketed, expected):
    # Same gradients summed in the same order (one rank): equal to rounding.
    for got, want in zip(bucketed, expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bucket_mb", [0.01, 25])
def test_trainer_reduces_every_gradient_in_its_buckets(bucket_mb, tmp_path):
    net, reference, x, y = twin_nets(tmp_path)
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

    expected = train_steps(plain_trainer(reference, momentum=0.9), reference, x, y)
    assert_same_training(bucketed, expected)


def test_zero_bucket_size_keeps_one_call_per_parameter(tmp_path):
    net, _, x, y = twin_nets(tmp_path)
    store = RecordingStore()
    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                              kvstore=store, update_on_kvstore=False, bucket_mb=0)
    train_steps(trainer, net, x, y, steps=1)
    assert trainer.buckets == []
    with_grad = [i for i, p in enumerate(trainer._params)  # pylint: disable=protected-access
                 if p.grad_req != "null"]
    assert len(with_grad) == 6  # BatchNorm's running statistics have no gradient
    assert store.calls == with_grad


def test_stores_that_cannot_group_keep_the_trainers_exchange(tmp_path):
    net, _, x, y = twin_nets(tmp_path)
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


@pytest.mark.parametrize("hybridize", [None, {}, {"static_alloc": True, "static_shape": True}],
                         ids=["imperative", "hybridized", "static"])
@pytest.mark.parametrize("before_first_step", [False, True])
def test_gradients_are_views_into_one_flat_buffer(hybridize, before_first_step, tmp_path):
    """Zero-copy buckets: each gradient is a slice of its bucket's flat buffer, and training
    matches Gluon's own Trainer on a separately built copy of the net, also when a
    static_alloc graph ran backward before the buckets existed (it keeps writing its own
    arrays, which are then copied in)."""
    net, reference, x, y = twin_nets(tmp_path, hybridize)
    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1,
                                                            "momentum": 0.9},
                              kvstore=RecordingStore(), update_on_kvstore=False,
                              bucket_mb=0.01)
    if before_first_step:  # as hvdtrain's broadcast_parameters does
        trainer._init_kvstore()  # pylint: disable=protected-access
    bucketed = train_steps(trainer, net, x, y)
    expected = train_steps(plain_trainer(reference, momentum=0.9), reference, x, y)
    assert_same_training(bucketed, expected)
    # Backward writes into the buckets themselves unless a static graph ran it first.
    assert (trainer.copied_gradients > 0) == (hybridize is not None and "static_alloc" in
                                              hybridize and not before_first_step)

    params = trainer._params  # pylint: disable=protected-access
    assert len(trainer.buckets) > 1
    for bucket, (flat,) in zip(trainer.buckets, trainer._flat_grads):  # pylint: disable=protected-access
        assert flat.size == sum(params[i].data().size for i in bucket)
        assert all(_writes_through(flat, params[i].grad()) for i in bucket)


def test_several_devices_each_get_a_flat_buffer(tmp_path):
    devices = [mx.cpu(0), mx.cpu(1)]

    def build():
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(16, activation="relu", in_units=32),
                gluon.nn.Dense(10, in_units=16))
        return net

    net, reference = build(), build()
    net.initialize(mx.init.Xavier(), ctx=devices)
    net.save_parameters(str(tmp_path / "start.params"))
    reference.load_parameters(str(tmp_path / "start.params"), ctx=devices)
    x, y = mx.nd.random.uniform(shape=(8, 32)), mx.nd.array(np.arange(8) % 10)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def steps(net, trainer):
        for _ in range(3):
            with autograd.record():
                losses = [loss_fn(net(xs), ys) for xs, ys in
                          zip(gluon.utils.split_and_load(x, devices),
                              gluon.utils.split_and_load(y, devices))]
            autograd.backward(losses)
            trainer.step(len(y))
        return [p.data(devices[1]).asnumpy() for p in net.collect_params().values()]

    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                              kvstore=RecordingStore(), update_on_kvstore=False, bucket_mb=25)
    bucketed = steps(net, trainer)
    assert [f.context for f in trainer._flat_grads[0]] == devices  # pylint: disable=protected-access
    assert_same_training(bucketed, steps(reference, plain_trainer(reference)))


def zoo_bucket_count(model, dtype):
    """Buckets the Trainer plans for a model-zoo net at the default cap, as ``--dtype``
    leaves it: ``cast('float16')`` keeps BatchNorm's parameters float32, so float16 and
    float32 gradients alternate through the whole net."""
    net = vision.get_model(model, classes=10)
    net.initialize()
    with autograd.train_mode():
        net(mx.nd.zeros((1, 3, 32, 32)))  # shapes only; float16 cannot run on a CPU
    if dtype == "float16":
        net.cast("float16")
    trainer = BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                              kvstore=RecordingStore(), update_on_kvstore=False, bucket_mb=25)
    trainer._init_kvstore()  # pylint: disable=protected-access  (plans the buckets)
    dtypes = {np.dtype(trainer._params[i].grad().dtype).name for b in trainer.buckets for i in b}  # pylint: disable=protected-access
    assert dtypes == ({"float16", "float32"} if dtype == "float16" else {"float32"})
    return len(trainer.buckets)


@pytest.mark.parametrize("model", ["resnet18_v1", "resnet50_v1"])
def test_float16_models_get_about_as_many_buckets_as_float32(model):
    counts = {dtype: zoo_bucket_count(model, dtype) for dtype in ("float32", "float16")}
    logging.getLogger("hvdtrain").info("%s buckets at 25 MiB: %s", model, counts)
    assert counts["float16"] <= 2 * counts["float32"], counts
