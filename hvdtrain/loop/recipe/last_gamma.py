"""``--last-gamma``: each residual block's last BatchNorm gamma starts at zero.

Then every residual branch outputs zero at the start and each block begins as the identity
(its shortcut), which lets a deep ResNet train at a larger learning rate from the start
("Bag of Tricks", He et al. 2019, section 3.1; Goyal et al. 2017). The blocks are found
by their type in MXNet's model zoo (``mxnet.gluon.model_zoo.vision.resnet``), and which
BatchNorm is "last" follows GluonCV's ``last_gamma`` (gluoncv/model_zoo/resnet.py, used by
its ``train_imagenet.py`` and by Horovod's MXNet ImageNet example):

- v1 (``BasicBlockV1``, ``BottleneckV1``): the BatchNorm after the branch's last
  convolution, i.e. the last BatchNorm of ``body`` (the shortcut's own BatchNorm, in
  ``downsample``, is left alone);
- v2 (``BasicBlockV2``, ``BottleneckV2``, pre-activation): a v2 branch ends in a convolution,
  with no BatchNorm after it; the last BatchNorm *before* it (``bn2``, ``bn3``) is zeroed.
  With its beta at zero as well, the ReLU after it gives zeros, and so does the branch's
  last convolution (it has no bias).

It changes the initial values only: :func:`zero_last_gammas` runs right after the model is
initialised, before rank 0's values are broadcast to every rank. A resumed run (or weights
loaded into the model afterwards) keeps the values it loads.
"""
from __future__ import annotations

import logging
from typing import List

from mxnet.gluon import nn
from mxnet.gluon.model_zoo.vision import resnet

from ...config import ConfigError

logger = logging.getLogger("hvdtrain")

V1_BLOCKS = (resnet.BasicBlockV1, resnet.BottleneckV1)
V2_BLOCKS = (resnet.BasicBlockV2, resnet.BottleneckV2)


def last_batchnorms(net) -> List[nn.BatchNorm]:
    """Each residual block's last BatchNorm, in the order of the blocks (empty for a model
    without model-zoo ResNet blocks)."""
    found = []

    def visit(block):
        if isinstance(block, V1_BLOCKS):
            layers = list(block.body)
        elif isinstance(block, V2_BLOCKS):
            layers = [getattr(block, name) for name in ("bn1", "bn2", "bn3")
                      if hasattr(block, name)]
        else:
            return
        norms = [layer for layer in layers if isinstance(layer, nn.BatchNorm)]
        found.append(norms[-1])

    net.apply(visit)
    return found


def check_last_gamma(net, model_name: str) -> List[nn.BatchNorm]:
    """The BatchNorms ``--last-gamma`` zeroes in `net`; refuse a model that has none."""
    norms = last_batchnorms(net)
    if not norms:
        raise ConfigError(f"--last-gamma zeroes the last BatchNorm of each residual block; "
                          f"--model {model_name} has no model-zoo ResNet blocks: use a "
                          f"resnet*_v1 or resnet*_v2 model, or drop --last-gamma")
    return norms


def zero_last_gammas(net, model_name: str) -> int:
    """Set each residual block's last BatchNorm gamma of the initialised `net` to zero (on
    every device) and return how many there were."""
    norms = check_last_gamma(net, model_name)
    for norm in norms:
        for copy in norm.gamma.list_data():
            copy[:] = 0
    logger.info("--last-gamma: the last BatchNorm gamma of %d residual blocks starts at 0",
                len(norms))
    return len(norms)
