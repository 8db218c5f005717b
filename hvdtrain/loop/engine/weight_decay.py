"""``--no-wd``: no weight decay on biases and on normalisation layers' gamma and beta.

The parameters are found by the role their layer gives them, not by their names: every
normalisation layer's ``gamma`` and ``beta`` (BatchNorm, its SyncBatchNorm and BatchNormReLU
variants, LayerNorm, InstanceNorm, GroupNorm) and the ``bias`` of every dense and
convolution layer, wherever they sit in the model. GluonCV's ``--no-wd`` selects the same
parameters by the name pattern ``.*beta|.*gamma|.*bias``, which depends on how a model
names its layers; torchvision's ``--norm-weight-decay 0`` takes the normalisation layers by
type, as here, and ``--bias-weight-decay 0`` every parameter named ``bias``.

Each is given ``wd_mult = 0``: Gluon's optimizers read it from the parameter at every
update, so it holds through a checkpoint's optimizer state and an elastic restore alike.
"""
from __future__ import annotations

import logging
from typing import Dict, List

from mxnet.gluon import nn

logger = logging.getLogger("hvdtrain")

NORM_LAYERS = (nn.BatchNorm, nn.BatchNormReLU, nn.LayerNorm, nn.InstanceNorm, nn.GroupNorm)
BIASED_LAYERS = (nn.Dense, nn.Conv1D, nn.Conv2D, nn.Conv3D, nn.Conv1DTranspose,
                 nn.Conv2DTranspose, nn.Conv3DTranspose)


def undecayed_params(net) -> Dict[str, List]:
    """The parameters of `net` that ``--no-wd`` exempts, by role (``"normalisation"``: the
    normalisation layers' gamma and beta; ``"bias"``: dense and convolution layers' bias),
    each once, in the order the layers are visited; only those a gradient trains."""
    found: Dict[str, List] = {"normalisation": [], "bias": []}
    seen = set()

    def visit(block):
        if isinstance(block, NORM_LAYERS):
            role, params = "normalisation", (block.gamma, block.beta)
        elif isinstance(block, BIASED_LAYERS):
            role, params = "bias", (block.bias,)
        else:
            return
        for param in params:
            if param is not None and param.grad_req != "null" and id(param) not in seen:
                seen.add(id(param))
                found[role].append(param)

    net.apply(visit)
    return found


def exempt_from_weight_decay(net) -> int:
    """Set ``wd_mult = 0`` on the parameters :func:`undecayed_params` names, say how many
    in one line, and return that count."""
    roles = undecayed_params(net)
    exempt = roles["normalisation"] + roles["bias"]
    for param in exempt:
        param.wd_mult = 0.0
    trained = [p for p in net.collect_params().values() if p.grad_req != "null"]
    logger.info("--no-wd: no weight decay on %d of %d trained parameters (normalisation "
                "gammas and betas: %d, biases: %d)", len(exempt), len(trained),
                len(roles["normalisation"]), len(roles["bias"]))
    return len(exempt)
