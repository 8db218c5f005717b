"""Rebuild a trained Gluon net from its model card and parameter file, checked.

The net comes from :func:`hvdtrain.models.build_model` with the card's model name and class
count, on the CPU, in float32 (a ``--dtype float16`` model's parameters are cast up, which is
exact: MXNet 1.9.1 has no float16 CPU kernels, and float32 is what onnxruntime and most
servers expect). The file is read once and compared with the net before any value is set, so
weights of another architecture, another class count or a damaged file are refused in one
line naming the first parameter that does not fit.
"""
from __future__ import annotations

from typing import Dict

import mxnet as mx

from ..loop.weights.files import WeightsError, read_params
from ..models import build_model


def input_shape(card: Dict, batch: int = 1) -> tuple:
    """The model's input shape with a leading batch axis."""
    return (batch,) + tuple(card["input"]["shape"])


def rebuild(card: Dict, params_path: str) -> mx.gluon.HybridBlock:
    """The card's model holding the parameters in `params_path`, not yet hybridized."""
    net = build_model(card["model"], card["num_classes"])
    net.initialize(ctx=mx.cpu())  # placeholders: every value is replaced below
    net(mx.nd.zeros(input_shape(card)))  # settles the deferred shapes
    load_checked(net, params_path, card)
    return net


def load_checked(net, params_path: str, card: Dict) -> None:
    """Set every parameter of `net` from `params_path` (Gluon ``save_parameters`` format),
    after checking that the file holds exactly these names and shapes."""
    saved = read_params(params_path, advice="copy it again, or export another checkpoint of "
                                             "the run")
    wanted = net._collect_params_with_prefix()  # pylint: disable=protected-access
    missing = [name for name in wanted if name not in saved]
    extra = [name for name in saved if name not in wanted]
    wrong = [name for name in wanted if name in saved and saved[name].shape != wanted[name].shape]
    if missing or extra or wrong:
        if wrong:
            first = (f"{wrong[0]!r} is {_dims(saved[wrong[0]].shape)} in the file, "
                     f"{_dims(wanted[wrong[0]].shape)} in the model")
        elif missing:
            first = f"{missing[0]!r} is missing from the file"
        else:
            first = f"the file has {extra[0]!r}, which the model lacks"
        raise WeightsError(
            f"{params_path} does not hold the parameters of {card['model']} with "
            f"{card['num_classes']} classes (its model card): {first} ({len(wrong)} shapes "
            f"differ, {len(missing)} missing, {len(extra)} unknown, of {len(wanted)}); "
            f"were these weights written by another model?")
    for name, param in wanted.items():
        param.set_data(saved[name].astype(param.dtype))


def _dims(shape) -> str:
    return "x".join(map(str, shape))
