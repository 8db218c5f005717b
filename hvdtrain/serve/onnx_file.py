"""MXNet's deployable pair to ONNX, through MXNet 1.9.1's own exporter (``mx.onnx``).

That exporter reads ``onnx.mapping``, which onnx 1.19 removed: hvdtrain pins onnx 1.18.0,
the newest release that still has it (setup.cfg's ``onnx`` extra, constraints.txt). The
file gets a dynamic batch axis, and the parameters are left out of the graph's inputs
(the exporter lists them there, which keeps onnxruntime from folding them as constants and
makes it warn once per parameter); ``onnx.checker`` then checks the result.
"""
from __future__ import annotations

import os
from typing import Tuple

import numpy as np


class OnnxUnavailable(Exception):
    """The onnx package is missing or is a version MXNet's exporter cannot use."""


def onnx_module():
    """The ``onnx`` module, if MXNet's exporter can use it (else OnnxUnavailable)."""
    try:
        # pylint: disable=import-outside-toplevel,unused-import
        import onnx
        from onnx import mapping  # noqa: F401  (gone in onnx >= 1.19: the exporter fails)
    except ImportError as err:
        raise OnnxUnavailable(f"{err} (install hvdtrain's onnx extra: pip install -c "
                              f"constraints.txt 'hvdtrain[onnx]')") from None
    return onnx


def export_onnx(symbol_path: str, params_path: str, shape: Tuple[int, ...],
                onnx_path: str) -> None:
    """Convert the pair to `onnx_path` (written under a temporary name, then renamed), its
    input ``data`` of `shape` (channels, height, width) and any batch size, float32."""
    onnx = onnx_module()
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    tmp = os.path.join(os.path.dirname(os.path.abspath(onnx_path)),
                       f".{os.path.basename(onnx_path)}.tmp-{os.getpid()}")
    try:
        mx.onnx.export_model(symbol_path, params_path, in_shapes=[(1,) + tuple(shape)],
                             in_types=[np.float32], onnx_file_path=tmp, dynamic=True,
                             dynamic_input_shapes=[(None,) + tuple(shape)])
        model = onnx.load(tmp)
        constants = {init.name for init in model.graph.initializer}
        inputs = [value for value in model.graph.input if value.name not in constants]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        onnx.checker.check_model(model)
        onnx.save(model, tmp)
        os.replace(tmp, onnx_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
