"""--last-gamma on every model-zoo ResNet: each residual block starts as its shortcut.

The check is behavioural, not a list of names: with the last BatchNorm gamma of a block at
zero (and its beta at zero, as initialised), the residual branch adds nothing, so a block
whose shortcut is the identity returns its input (v2: ``x + 0``; v1: ``relu(x + 0)`` of an
input that is already the output of a ReLU), in training mode (batch statistics) as in
prediction."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon.model_zoo.vision import resnet

from hvdtrain.config import ZOO_MODELS
from hvdtrain.loop.recipe.last_gamma import last_batchnorms, zero_last_gammas
from hvdtrain.models import build_model

RESNETS = [m for m in ZOO_MODELS if m.startswith("resnet")]
BLOCKS = {18: 8, 34: 16, 50: 16, 101: 33, 152: 50}  # residual blocks per depth
BLOCK_TYPES = (resnet.BasicBlockV1, resnet.BottleneckV1, resnet.BasicBlockV2,
               resnet.BottleneckV2)


def blocks_in_and_out(net, train):
    """[(block, its input, its output)] of every residual block in one forward pass."""
    seen = []

    def attach(block):
        if isinstance(block, BLOCK_TYPES):
            block.register_forward_hook(
                lambda b, inputs, output: seen.append((b, inputs[0].asnumpy(),
                                                       output.asnumpy())))
    net.apply(attach)
    x = mx.nd.array(np.random.default_rng(0).normal(size=(2, 3, 32, 32)))
    with autograd.record(train_mode=train):
        net(x)
    return seen


def identity_blocks(seen):
    """The blocks whose shortcut is the identity, with whether their input went through
    the branch unchanged."""
    return [np.array_equal(out, inp) for block, inp, out in seen if block.downsample is None]


@pytest.mark.parametrize("model", RESNETS)
def test_every_resnet_block_starts_as_its_shortcut(model):
    mx.random.seed(0)
    net = build_model(model, 10)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 32, 32)))
    assert not any(identity_blocks(blocks_in_and_out(net, train=True)))  # before: not
    depth = int(model[len("resnet"):].split("_")[0])
    assert zero_last_gammas(net, model) == BLOCKS[depth]
    zeroed = {id(bn) for bn in last_batchnorms(net)}
    for bn in _batchnorms(net):
        want = 0.0 if id(bn) in zeroed else 1.0
        if bn.gamma.grad_req != "null":  # v2's input BatchNorm has no gamma to train
            assert np.all(bn.gamma.data().asnumpy() == want), bn.name
    for train in (True, False):
        identities = identity_blocks(blocks_in_and_out(net, train))
        assert identities and all(identities), (model, train)
    # The zeroed BatchNorm is the branch's last, never the shortcut's (v1's downsample).
    for block in _blocks(net):
        if isinstance(block, (resnet.BasicBlockV1, resnet.BottleneckV1)) and block.downsample:
            assert np.all(block.downsample[1].gamma.data().asnumpy() == 1.0)


def _batchnorms(net):
    found = []
    net.apply(lambda b: found.append(b) if isinstance(b, mx.gluon.nn.BatchNorm) else None)
    return found


def _blocks(net):
    found = []
    net.apply(lambda b: found.append(b) if isinstance(b, BLOCK_TYPES) else None)
    return found


@pytest.mark.parametrize("model", ["simple_cnn", "bn_cnn", "mobilenet1.0", "vgg11_bn",
                                   "densenet121"])
def test_a_model_without_resnet_blocks_has_none_to_zero(model):
    assert last_batchnorms(build_model(model, 10)) == []
