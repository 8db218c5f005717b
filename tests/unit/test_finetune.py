"""Fine-tuning: the output layer found by structure for every model, ``--head-lr-mult`` on
it (one SGD step against NumPy), and ``--freeze-epochs``: frozen arrays neither change nor
reach the store, the gradient buckets follow each phase, and a resumed run is in the phase
of its epoch. (Several ranks: tests/dist/test_finetune_transfer.py.)"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import hvdtrain.loop.run.fit as fit_module
from hvdtrain.config import ConfigError, TrainConfig
from hvdtrain.classify.build import build_trainer
from hvdtrain.loop.weights.finetune import output_layer, set_head_lr_mult, set_phase
from hvdtrain.models import build_model, model_names
from hvdtrain.store.dist import DistContext
from hvdtrain.store.kvstore import HorovodKVStore
from weights_cases import DIGITS, arrays_of, assert_from, file_arrays

HEAD = ("5.weight", "5.bias")  # simple_cnn's output layer


@pytest.mark.parametrize("name", model_names())
def test_the_output_layer_is_the_part_whose_shapes_follow_the_classes(name):
    """The rule by structure (``output``, or a sequential net's last layer with parameters)
    against an independent one: the parameters whose shapes change with the class count
    (uninitialised nets, so each model costs milliseconds)."""
    seven, nine = build_model(name, 7), build_model(name, 9)
    head = output_layer(seven)
    shapes = [{place: p.shape for place, p in net._collect_params_with_prefix().items()}
              for net in (seven, nine)]
    following = {place for place in shapes[0] if shapes[0][place] != shapes[1][place]}
    assert head and set(head) == following, (sorted(head), sorted(following))
    assert all(param.shape[0] == 7 for param in head.values())


class Headless(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.fc = gluon.nn.Dense(3)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return self.fc(x)


def test_without_an_output_layer_the_fine_tuning_flags_refuse():
    net = Headless()
    assert output_layer(net) == {}
    with pytest.raises(ConfigError, match="--head-lr-mult: this model has no output layer"):
        set_head_lr_mult(net, 10)
    with pytest.raises(ConfigError, match="--freeze-epochs: this model has no output layer"):
        set_phase(net, 0, 1)


def test_the_output_layer_learns_head_lr_mult_times_faster_one_sgd_step_against_numpy():
    """One SGD step (no momentum, no weight decay) through hvdtrain's trainer: the output
    layer moves by lr x 10 x its gradient, computed here in NumPy from the features it is
    given; the layer before it by lr x its gradient."""
    lr, mult, batch = 0.1, 10.0, 6
    cfg = TrainConfig(dataset="digits", no_cuda=True, kvstore="none", lr=lr, momentum=0.0,
                      wd=0.0, init_from="w.params", head_lr_mult=mult)
    mx.random.seed(5)
    net = build_model("simple_cnn", 10)
    net.initialize(mx.init.Xavier())
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.uniform(0, 1, (batch, 1, 8, 8)))
    y = rng.integers(0, 10, batch)
    net(x)
    set_head_lr_mult(net, cfg.head_lr_mult)
    trainer = build_trainer(net, cfg, DistContext())
    before = arrays_of(net)
    features = net[:-1](x).asnumpy()  # what the output layer sees (no dropout, no BN)
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), mx.nd.array(y))
    loss.backward()
    backbone_grad = net[-2].weight.grad().asnumpy()
    trainer.step(batch)
    after = arrays_of(net)

    logits = features @ before["5.weight"].T + before["5.bias"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(batch), y] -= 1  # d(loss)/d(logits), summed over the batch below
    np.testing.assert_allclose(after["5.weight"],
                               before["5.weight"] - lr * mult * (p.T @ features) / batch,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after["5.bias"], before["5.bias"] - lr * mult * p.sum(0) / batch,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after["4.weight"], before["4.weight"] - lr * backbone_grad / batch,
                               rtol=1e-5, atol=1e-6)


def test_head_lr_mult_reaches_the_output_layer_of_the_run(start, two_epochs):
    code, lines, _ = start(DIGITS + ["--init-from", str(two_epochs), "--head-lr-mult", "10"])
    assert code == 0, lines
    assert start.lr_mult == {place: 10.0 if place in HEAD else 1.0 for place in start.lr_mult}
    assert any("the output layer (5.weight, 5.bias) learns at 10 x the learning rate" in line
               for line in lines), lines


@pytest.fixture
def exchanged(monkeypatch):
    """{epoch: [bytes the horovod store's pushpull was handed, per call]}, and {epoch: the
    net's arrays after it}, recorded while a run trains in this process."""
    record = {"bytes": {}, "after": {}, "trainer": None, "epoch": None}
    pushpull = HorovodKVStore.pushpull

    def counted(self, key, value, out=None, priority=0):
        arrays = value if isinstance(value, (list, tuple)) else [value]
        record["bytes"].setdefault(record["epoch"], []).append(
            sum(a.size * np.dtype(a.dtype).itemsize for a in arrays))
        return pushpull(self, key, value, out, priority)

    train_epoch = fit_module.train_epoch

    def epoch(loop, loader, state):
        record["epoch"], record["trainer"] = state.epoch, loop.trainer
        stats = train_epoch(loop, loader, state)
        record["after"][record["epoch"]] = arrays_of(loop.net)
        record["steps"] = stats.steps
        return stats

    monkeypatch.setattr(HorovodKVStore, "pushpull", counted)
    monkeypatch.setattr(fit_module, "train_epoch", epoch)
    return record


def test_frozen_epochs_exchange_only_the_output_layer_and_then_the_backbone_trains(
        start, two_epochs, exchanged):
    """Horovod's store in one process (its pushpull is still called, once per bucket): in the
    frozen epoch each step hands it the output layer's gradient alone and the backbone stays
    as loaded; after the unfreezing the buckets are planned again over every gradient."""
    source = file_arrays(two_epochs / "checkpoints" / "epoch-0002" / "model.params")
    code, lines, _ = start(DIGITS + ["--kvstore", "horovod", "--init-from", str(two_epochs),
                                     "--freeze-epochs", "1", "--epochs", "2"], train=True)
    assert code == 0, lines
    backbone = [place for place in source if place not in HEAD]
    assert_from(exchanged["after"][0], source, backbone)
    assert not np.array_equal(exchanged["after"][0]["5.weight"], source["5.weight"])
    head_bytes = 4 * (10 * 128 + 10)
    all_bytes = 4 * sum(array.size for array in source.values())
    steps = exchanged["steps"]
    assert exchanged["bytes"][0] == [head_bytes] * steps  # one bucket: the output layer
    assert exchanged["bytes"][1] == [all_bytes] * steps
    for place in backbone:
        assert not np.array_equal(exchanged["after"][1][place], source[place]), place
    trainer = exchanged["trainer"]
    assert (trainer.replans, trainer.copied_gradients) == (1, 0)
    said = "\n".join(lines)
    assert "epochs 1-1: the backbone is frozen (6 arrays take no gradient and are not " \
           "exchanged); only the output layer trains" in said
    assert "epoch 2: the backbone trains from here on (6 more arrays take gradients)" in said


def test_a_resumed_run_is_in_the_phase_of_its_epoch(start, two_epochs, tmp_path):
    """Stopped inside the frozen epoch, a resume finishes it frozen; resumed past
    --freeze-epochs, the backbone trains."""
    source = file_arrays(two_epochs / "checkpoints" / "epoch-0002" / "model.params")
    backbone = [place for place in source if place not in HEAD]
    run = tmp_path / "run"
    flags = DIGITS + ["--init-from", str(two_epochs), "--freeze-epochs", "1", "--resume",
                      "auto", "--output-dir", str(run)]
    code, lines, _ = start(flags + ["--epochs", "1", "--max-steps", "5"], train=True)
    assert code == 0, lines
    code, lines, _ = start(flags + ["--epochs", "1"], train=True)
    assert code == 0, lines
    assert "epochs 1-1: the backbone is frozen" in "\n".join(lines)
    first = file_arrays(run / "checkpoints" / "epoch-0001" / "model.params")
    assert_from(first, source, backbone)
    code, lines, _ = start(flags + ["--epochs", "2"], train=True)
    assert code == 0, lines
    said = "\n".join(lines)
    assert "backbone is frozen" not in said and "epoch 2: the backbone trains" not in said
    second = file_arrays(run / "checkpoints" / "epoch-0002" / "model.params")
    for place in backbone:
        assert not np.array_equal(second[place], first[place]), place
