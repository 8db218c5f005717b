"""One worker driving several devices (mx.cpu(i) stand in for GPUs)."""
import mxnet as mx
import numpy as np
import pytest

from helpers import assert_arrays_close

from hvdtrain.config import ConfigError, TrainConfig
from hvdtrain.job import train

FOUR = [mx.cpu(i) for i in range(4)]
# digits has 1437 training samples: 4 devices x 359 leave a last batch of 1 sample.
BASE = dict(dataset="digits", no_cuda=True, epochs=1, lr=0.1, log_interval=0,
            kvstore="device", progress=False)


def copies(net):
    """name -> list of the device copies of that array, as numpy."""
    return {name: [c.asnumpy() for c in p.list_data()]
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def test_last_batch_with_fewer_samples_than_devices_matches_one_device():
    four = train(TrainConfig(model="simple_cnn", batch_size=359, **BASE), devices=FOUR)
    one = train(TrainConfig(model="simple_cnn", batch_size=4 * 359, **BASE),
                devices=[mx.cpu(0)])
    assert four.result["steps"] == one.result["steps"] == 2
    # Idle devices add exactly nothing: the same model as one device with the whole batch.
    for name, arrays in copies(four.net).items():
        for array in arrays:
            # Four partial sums instead of one: the same value up to rounding.
            assert_arrays_close(array, copies(one.net)[name][0], 1e-5, what=name)
    assert four.result["test_count"] == 360


def test_batchnorm_copies_agree_on_every_device():
    run = train(TrainConfig(model="bn_cnn", batch_size=359, **BASE), devices=FOUR)
    arrays = copies(run.net)
    assert any(name.endswith("running_var") for name in arrays)
    for name, device_copies in arrays.items():
        for array in device_copies[1:]:
            # One averaged value copied to every device: bit-identical.
            assert_arrays_close(array, device_copies[0], 0, what=name)


def test_several_devices_without_a_store_are_refused():
    with pytest.raises(ConfigError, match="--kvstore none cannot train on 2 devices"):
        train(TrainConfig(model="mlp", batch_size=8, **dict(BASE, kvstore="none")),
              devices=FOUR[:2])


def test_an_idle_device_gets_zero_fresh_gradients_and_keeps_its_statistics():
    from mxnet import autograd
    from hvdtrain.models import build_model
    from hvdtrain.loop.engine.batches import settle_idle_devices

    net = build_model("bn_cnn", classes=10)
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    batch = mx.nd.array(np.random.default_rng(0).normal(2, 3, (4, 1, 8, 8)))
    with autograd.record():
        loss = net(batch).sum()
    loss.backward()
    mx.nd.waitall()  # static_alloc: the engine does not track BatchNorm's statistics writes
    stats = {name: p.data().asnumpy() for name, p in net.collect_params().items()
             if p.grad_req == "null"}
    params = list(net.collect_params().values())
    assert settle_idle_devices(params, 1) == 0  # backward ran there: left alone
    for param in (p for p in params if p.grad_req != "null"):  # applied, as after an update
        for data in param.list_data():
            data._fresh_grad = False  # pylint: disable=protected-access
    assert settle_idle_devices(params, 1) == 1  # the next step ran no backward pass there
    mx.nd.waitall()
    for name, param in net.collect_params().items():
        if param.grad_req == "null":
            np.testing.assert_array_equal(param.data().asnumpy(), stats[name], err_msg=name)
        else:
            assert not param.grad().asnumpy().any(), name
            assert param.data()._fresh_grad, name  # pylint: disable=protected-access


def test_half_batches_are_cast_on_the_device_not_in_numpy(monkeypatch):
    """--dtype float16: the batch is copied as the loader made it (float32) and cast by an
    engine operation on the device; a numpy cast on the main thread costs about a GPU step."""
    from hvdtrain.loop.engine import batches
    made = []
    real_array = mx.nd.array

    def recording_array(source, *args, **kwargs):
        made.append(kwargs.get("dtype"))
        return real_array(source, *args, **kwargs)

    monkeypatch.setattr(batches.mx.nd, "array", recording_array)
    images = np.random.RandomState(0).rand(5, 3, 4, 4).astype(np.float32)
    labels = np.arange(5, dtype=np.int32)
    xs, ys, idle = batches.split_batch(images, labels, [mx.cpu(0), mx.cpu(1)], "float16")
    assert made == [np.float32, np.int32]
    assert [x.dtype for x in xs] == [np.float16, np.float16] and idle == []
    np.testing.assert_array_equal(np.concatenate([x.asnumpy() for x in xs]),
                                  images.astype(np.float16))
    np.testing.assert_array_equal(np.concatenate([y.asnumpy() for y in ys]), labels)
