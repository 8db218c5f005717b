"""An export folder loaded for inference: its card and a function from batches to logits.

By default the MXNet pair runs in ``mx.gluon.SymbolBlock`` (what ``SymbolBlock.imports``
builds), hybridized; with ``onnx=True`` the ONNX file runs in onnxruntime on the CPU. Either
way nothing of hvdtrain's model code is used: the export is read as a server would read it.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Dict, Tuple

import numpy as np

from ..config import ConfigError
from ..data.card import CARD_FILE, read_card
from .export import ONNX, PARAMS, SYMBOL

Forward = Callable[[np.ndarray], np.ndarray]


class ModelError(ConfigError):
    """A MODEL folder that cannot be predicted with; the message says what to do."""


def load_export(folder: str, onnx: bool = False) -> Tuple[Dict, Forward]:
    """The card of the export in `folder` and its forward function (float32 NCHW batch to
    logits). Refuses, in one line, a folder that is no complete export, a run folder, and a
    model whose card has no image transform (the digits)."""
    card_path = os.path.join(folder, CARD_FILE)
    if not os.path.isdir(folder):
        raise ModelError(f"MODEL {folder} is not a folder: give the folder hvdtrain-export "
                         f"wrote")
    if not os.path.isfile(os.path.join(folder, SYMBOL)):
        what = "a training run" if os.path.isfile(os.path.join(folder, "model.params")) \
            else "not an export"
        raise ModelError(f"MODEL {folder} is {what} (no {SYMBOL}): export it first, "
                         f"hvdtrain-export RUN_OR_CHECKPOINT OUT, and give OUT")
    if not os.path.isfile(card_path):
        raise ModelError(f"MODEL {folder} has no {CARD_FILE}: the export is incomplete "
                         f"(cut short?); export again")
    card = read_card(card_path)
    if card["eval_transform"] is None:
        raise ModelError(f"MODEL {folder} ({card['model']} trained on {card['dataset']}) "
                         f"takes {'x'.join(map(str, card['input']['shape']))} arrays, not "
                         f"images: hvdtrain-predict reads models trained on images")
    if onnx:
        return card, _onnxruntime(os.path.join(folder, ONNX))
    return card, _symbol_block(os.path.join(folder, SYMBOL), os.path.join(folder, PARAMS))


def _symbol_block(symbol: str, params: str) -> Forward:
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    try:
        with warnings.catch_warnings():  # "cannot decide type" of `data`: it is float32
            warnings.simplefilter("ignore", UserWarning)
            net = mx.gluon.SymbolBlock.imports(symbol, ["data"], params, ctx=mx.cpu())
    except (mx.base.MXNetError, AssertionError, ValueError) as err:
        last = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ModelError(f"MXNet cannot load {symbol} with {params}: {last}; export "
                         f"again") from None
    net.hybridize()
    return lambda batch: net(mx.nd.array(batch, dtype=batch.dtype)).asnumpy()


def _onnxruntime(path: str) -> Forward:
    if not os.path.isfile(path):
        raise ModelError(f"{path} does not exist: export without --no-onnx, or predict "
                         f"with the MXNet pair (leave out --onnx)")
    try:
        import onnxruntime  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ModelError("--onnx needs onnxruntime: pip install -c constraints.txt "
                         "'hvdtrain[onnx]'") from None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    try:
        session = onnxruntime.InferenceSession(path, options,
                                               providers=["CPUExecutionProvider"])
    except Exception as err:  # pylint: disable=broad-except  (onnxruntime's own kinds)
        raise ModelError(f"onnxruntime cannot load {path}: {str(err)[:200]}") from None
    name = session.get_inputs()[0].name
    return lambda batch: session.run(None, {name: batch})[0]
