"""--no-wd against a plain Gluon Trainer whose parameters get ``wd_mult = 0`` by hand.

The reference names the exempt parameters itself: a list written out for each small model
(by place in the net, as ``save_parameters`` names them), and GluonCV's name pattern
``.*beta|.*gamma|.*bias`` for a model-zoo ResNet, where it picks the same parameters."""
import logging
import re

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain.config import TrainConfig
from hvdtrain.classify.build import build_trainer
from hvdtrain.loop.engine.weight_decay import undecayed_params
from hvdtrain.models import build_model
from hvdtrain.store.dist import DistContext

# Written out by hand from hvdtrain/models.py: bn_cnn is conv, BN, relu, conv, BN, relu,
# pool, dense (convolutions without bias); simple_cnn has biased convolutions and dense
# layers and no normalisation.
BY_HAND = {"bn_cnn": ["1.gamma", "1.beta", "4.gamma", "4.beta", "7.bias"],
           "simple_cnn": ["0.bias", "1.bias", "4.bias", "5.bias"],
           "mlp": ["1.bias", "2.bias"]}
SHAPE = {"bn_cnn": (1, 8, 8), "simple_cnn": (1, 8, 8), "mlp": (1, 8, 8),
         "resnet18_v1": (3, 32, 32), "resnet18_v2": (3, 32, 32)}
LR, WD = 0.1, 0.5  # a large decay, so that one applied where it should not shows at once


def places(net):
    return {id(p): name for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def initialised(model, seed=0):
    mx.random.seed(seed)
    net = build_model(model, 10)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((2,) + SHAPE[model]))
    return net


def exempt_names(net):
    roles = undecayed_params(net)
    where = places(net)
    return sorted(where[id(p)] for p in roles["normalisation"] + roles["bias"])


@pytest.mark.parametrize("model", sorted(BY_HAND))
def test_the_exempt_parameters_are_those_named_by_hand(model):
    assert exempt_names(initialised(model)) == sorted(BY_HAND[model])


@pytest.mark.parametrize("model", ["resnet18_v1", "resnet18_v2"])
def test_on_a_model_zoo_resnet_they_are_gluoncvs_pattern(model):
    net = initialised(model)
    pattern = re.compile(".*beta|.*gamma|.*bias")  # GluonCV train_imagenet.py's --no-wd
    by_pattern = sorted(name for name, p in net._collect_params_with_prefix().items()  # pylint: disable=protected-access
                        if pattern.match(p.name) and p.grad_req != "null")
    assert exempt_names(net) == by_pattern
    # Gammas and betas of 20 BatchNorms (v1: stem, 8 blocks x 2, 3 shortcuts) or 18 (v2:
    # stem, 8 blocks x 2, the last; its input BatchNorm has neither), and the output's bias.
    assert len(by_pattern) == {"resnet18_v1": 41, "resnet18_v2": 37}[model]


def copy_of(net, model):
    other = initialised(model, seed=1)
    theirs = other._collect_params_with_prefix()  # pylint: disable=protected-access
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        theirs[name].set_data(param.data().copy())
    return other


def train(net, trainer, model, steps=4):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(7)
    for _ in range(steps):
        x = mx.nd.array(rng.normal(size=(6,) + SHAPE[model]))
        y = mx.nd.array(rng.integers(0, 10, 6))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(6)
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


@pytest.mark.parametrize("model", ["bn_cnn", "simple_cnn"])
def test_no_wd_updates_as_a_plain_trainer_with_wd_mult_zero_set_by_hand(model, caplog):
    net = initialised(model)
    reference = copy_of(net, model)
    cfg = TrainConfig(dataset="digits", model=model, lr=LR, wd=WD, no_wd=True,
                      kvstore="none")
    with caplog.at_level(logging.INFO, logger="hvdtrain"):
        trainer = build_trainer(net, cfg, DistContext())
    trained = {"bn_cnn": 8, "simple_cnn": 8}[model]
    assert f"no weight decay on {len(BY_HAND[model])} of {trained} trained parameters" \
        in caplog.text
    theirs = reference._collect_params_with_prefix()  # pylint: disable=protected-access
    for name in BY_HAND[model]:
        theirs[name].wd_mult = 0.0
    plain = gluon.Trainer(reference.collect_params(), "sgd",
                          {"learning_rate": LR, "momentum": 0.9, "wd": WD}, kvstore=None)
    ours, want = train(net, trainer, model), train(reference, plain, model)
    for name in want:
        np.testing.assert_allclose(ours[name], want[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_the_reference_tells_decay_on_the_exempt_parameters_apart():
    """Without --no-wd the same steps end elsewhere: the comparison above has teeth."""
    net = initialised("bn_cnn")
    reference = copy_of(net, "bn_cnn")
    cfg = TrainConfig(dataset="digits", model="bn_cnn", lr=LR, wd=WD, kvstore="none")
    theirs = reference._collect_params_with_prefix()  # pylint: disable=protected-access
    for name in BY_HAND["bn_cnn"]:
        theirs[name].wd_mult = 0.0
    plain = gluon.Trainer(reference.collect_params(), "sgd",
                          {"learning_rate": LR, "momentum": 0.9, "wd": WD}, kvstore=None)
    ours = train(net, build_trainer(net, cfg, DistContext()), "bn_cnn")
    want = train(reference, plain, "bn_cnn")
    assert max(np.abs(ours[n] - want[n]).max() for n in BY_HAND["bn_cnn"]) > 0.05
