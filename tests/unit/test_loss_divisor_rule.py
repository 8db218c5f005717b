"""The loss divisor rule in one process (docs/estimator.md, "Batch processors"): two devices
whose losses divide their gradients by each device's own count train as one device over the
whole batch; a processor's own ``loss_divisor``; a step with no count applies no update; the
losses no rule covers are refused in one line; unusable samples are counted from what the
loader left out. (Several ranks: tests/dist/test_loss_divisors.py.)"""
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain import ConfigError
from hvdtrain.data.reshard import ShardedLoader
from hvdtrain.estimator import BatchProcessor, Estimator
from hvdtrain.estimator.loss_divisors import kind_of, self_normalising
from hvdtrain.loop.engine.counts import LeftOut
from hvdtrain.loop.engine.divisors import as_parts

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "dist"))
import loss_divisors_program as program  # noqa: E402
from loss_divisors_program import reference  # noqa: E402

TWO_DEVICES = [mx.cpu(0), mx.cpu(1)]


@pytest.mark.parametrize("kvstore", ["device", "horovod"])
@pytest.mark.parametrize("scenario", ["seg", "mix", "ssd", "ssd_accumulate"])
def test_two_devices_train_as_one_over_the_whole_batch(scenario, kvstore, tmp_path):
    """Each device's part is divided by its own count (a loss called per device) or by the
    whole batch's (SSD): both as one device over the batch of both."""
    estimator, loader = program.build(scenario, 2, str(tmp_path), TWO_DEVICES,
                                      kvstore=kvstore)
    start = program.arrays(estimator.net)
    estimator.fit(loader, epochs=1)
    want = reference(scenario, 2, start)
    for name, value in want.items():
        np.testing.assert_allclose(program.arrays(estimator.net)[name], value, rtol=1e-6,
                                   atol=1e-6, err_msg=name)


@pytest.mark.parametrize("scenario", ["mix", "ssd_accumulate"])
def test_gradients_backward_wrote_outside_their_bucket_are_scaled_too(scenario, tmp_path):
    """A net hybridized with static_alloc that ran backward before the buckets existed
    writes its own arrays: they are brought into the buckets before the scaling."""
    estimator, loader = program.build(scenario, 2, str(tmp_path), TWO_DEVICES,
                                      kvstore="horovod")
    estimator.net.hybridize(static_alloc=True, static_shape=True)
    with autograd.record():
        outs = [estimator.net(part) for part in
                program.split_over(next(iter(loader))[0], TWO_DEVICES)]
        total = mx.nd.add_n(*[out[0].sum() for out in outs])
    total.backward()
    for param in estimator.net.collect_params().values():
        param.zero_grad()
    start = program.arrays(estimator.net)
    estimator.fit(loader, epochs=1)
    assert estimator.trainer.copied_gradients > 0
    for name, value in reference(scenario, 2, start).items():
        np.testing.assert_allclose(program.arrays(estimator.net)[name], value, rtol=1e-6,
                                   atol=1e-6, err_msg=name)


class MaskedL2(BatchProcessor):
    """A loss of the program's own that divides by the batch's unmasked values, and says so
    (loss_divisor): one value per sample, its gradient a mean over the batch's values."""

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        x, y, mask = (a.as_in_context(estimator.context[0]) for a in train_batch)
        with autograd.record():
            pred = estimator.net(x).reshape((0, -1))
            loss = (0.5 * (pred - y) ** 2 * mask).sum(axis=1) / mx.nd.maximum(mask.sum(), 1)
        estimator.backward([loss])
        self.count = float(mask.sum().asscalar())
        return [x], [y], [pred], [loss]

    def loss_divisor(self, batch, out):
        return self.count


def masked_data():
    x, y, mask = program.items_data(2, "tokens")
    mask[:8] = 0  # the first step (batch 8) has no value: its divisor is 0
    return x, y, mask


def test_a_processor_declares_its_divisor_and_a_step_without_count_applies_none():
    net = program.make_net("tokens")
    start = program.arrays(net)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1,
                                                          "momentum": 0.9})
    estimator = Estimator(net, gluon.loss.L2Loss(), trainer=trainer, context=mx.cpu(),
                          batch_processor=MaskedL2(), kvstore="none", log_interval=0)
    data = gluon.data.ArrayDataset(*masked_data())
    estimator.fit(gluon.data.DataLoader(data, batch_size=8), epochs=1)
    # The reference: the first step is skipped (no value to average), the second is one
    # backward pass over the batch, its gradient the mean over its values, step(8).
    ref = program.make_net("tokens")
    program.set_arrays(ref, start)
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.1,
                                                              "momentum": 0.9})
    x, y, mask = (mx.nd.array(a[8:]) for a in masked_data())
    with autograd.record():
        loss = (0.5 * (ref(x).reshape((0, -1)) - y) ** 2 * mask).sum() / mask.sum()
    loss.backward()
    ref_trainer.step(8)
    for name, value in program.arrays(ref).items():
        np.testing.assert_allclose(program.arrays(net)[name], value, rtol=1e-6, atol=1e-7,
                                   err_msg=name)


class Normalised(gluon.loss.Loss):
    """MXNet's SoftmaxOutput with normalization='valid', as a loss: per-sample in shape,
    divided by the batch's valid labels in its gradient."""

    def __init__(self, **kwargs):
        super().__init__(None, 0, **kwargs)

    def hybrid_forward(self, F, pred, label):  # pylint: disable=arguments-differ
        out = F.SoftmaxOutput(pred, label, use_ignore=True, normalization="valid")
        return -F.log(F.pick(out, label, axis=1))


def test_losses_no_rule_covers_are_refused_in_one_line():
    from gluoncv.loss import (ICNetLoss, MixSoftmaxCrossEntropyLoss, SoftmaxCrossEntropyLoss,
                              SoftmaxCrossEntropyOHEMLoss)
    assert kind_of(SoftmaxCrossEntropyLoss()) == "valid"
    assert kind_of(SoftmaxCrossEntropyLoss(size_average=False)) is None
    assert kind_of(MixSoftmaxCrossEntropyLoss(aux=True, mixup=True)) is None
    assert kind_of(gluon.loss.SoftmaxCrossEntropyLoss()) is None
    assert kind_of(ICNetLoss()) == "valid"  # every head against the same label

    class OwnHeads(SoftmaxCrossEntropyLoss):
        def hybrid_forward(self, F, pred, label):  # pylint: disable=arguments-differ
            return super().hybrid_forward(F, pred, label) * 2

    with pytest.raises(ConfigError, match="OwnHeads.*loss_divisor"):
        Estimator(program.make_net("seg"), OwnHeads(), context=mx.cpu(), kvstore="none")
    with pytest.raises(ConfigError, match="OHEM.*loss_divisor"):
        kind_of(SoftmaxCrossEntropyOHEMLoss())
    assert self_normalising(Normalised(), 2) == "SoftmaxOutput(normalization='valid')"
    assert self_normalising(gluon.loss.SoftmaxCrossEntropyLoss(), 2) is None
    net = gluon.nn.Dense(3)
    net.initialize()
    estimator = Estimator(net, Normalised(), context=mx.cpu(), kvstore="none",
                          log_interval=0)
    data = gluon.data.ArrayDataset(np.ones((4, 2), np.float32), np.zeros(4, np.float32))
    with pytest.raises(ConfigError, match="Normalised divides its gradient .* loss_divisor"):
        estimator.fit(gluon.data.DataLoader(data, batch_size=2), epochs=1)


def test_a_divisor_is_a_number_or_one_a_device_part():
    assert as_parts(3, 2) == ([3.0, 3.0], 3.0)
    assert as_parts([2, 5], 2) == ([2.0, 5.0], 7.0)
    assert as_parts(mx.nd.array([4]), 1) == ([4.0], 4.0)
    with pytest.raises(ValueError, match="one per part"):
        as_parts([1, 2, 3], 2)


class Streamed:
    """A loader that keeps a list of its unusable samples but decodes ahead (as the
    command's streamed image loader does): its list says nothing of the batch in hand."""

    skipped = ["decoded ahead"]


def test_unusable_samples_are_what_the_loader_left_out():
    # A resharded Gluon loader: what it names as it yields each batch, whatever the
    # processor counts (items here: 0-2 a sample, fewer than the positions).
    data = program.Unusable(gluon.data.ArrayDataset(*program.items_data(2, "objects")))
    loader = ShardedLoader(gluon.data.DataLoader(data, batch_size=4), 1, 0, train=True)
    left_out = LeftOut(loader)
    counted = [left_out.of(batch, 4) for batch in loader]
    assert counted == [1, 1, 0, 0] and sorted(program.BAD) == [1, 6]
    # The streamed loader: positions less the rows it made; no record: nothing left out.
    rows = LeftOut(Streamed())
    assert rows.of((np.zeros((3, 2)), np.zeros(3)), 4) == 1
    assert rows.of(None, 4) == 4
    assert LeftOut(object()).of((np.zeros((3, 2)),), 4) == 0
