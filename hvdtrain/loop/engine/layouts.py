"""Weights back in MXNet's own layout before training goes on after an inference pass.

With MKL-DNN (MXNet's CPU builds), an inference pass of a convolution leaves its weight in
MKL-DNN's layout. The next training forward pass queues the change back from inside the
running operator, behind whatever the Python thread has pushed by then: when that is
already the step's optimizer update, the update and the change of layout write the weight
in an order that depends on timing, and two ranks apply different updates. Seen with
GluonCV's CIFAR ResNet-20 at 2 ranks: the momentum of four stage-3 convolutions differed
after the first step that followed a validation, in every run; never with
``MXNET_ENGINE_TYPE=NaiveEngine`` or ``MXNET_MKLDNN_ENABLED=0``.

:class:`InferenceLayouts` watches the nets that share the trained parameters (the training
net and the validation net) with a forward pre-hook. After any forward pass outside
training mode (an evaluation, a handler's prediction) the next training step first waits
for the engine and changes every parameter back to the default layout itself
(:func:`~hvdtrain.store.gluon_internals.to_default_layout`): the training pass then finds
nothing to change, and the update is the last write of the step on every rank. A pass on
a part of the net alone (``net.features(x)``) is not seen; the replica check at the
epoch's end names what it changes (:mod:`hvdtrain.loop.run.replica_check`).
"""
from __future__ import annotations

import re
import warnings
from typing import Sequence

import mxnet as mx
from mxnet import autograd

from ...store.gluon_internals import to_default_layout


def mkldnn_enabled() -> bool:
    """Whether this MXNet keeps arrays in MKL-DNN's layouts (its CPU builds)."""
    return mx.runtime.Features().is_enabled("MKLDNN")


class InferenceLayouts:
    """Notes inference passes of `nets` and settles their parameters' layout before the next
    training step (see the module). Without MKL-DNN it does nothing.

    Parameters
    ----------
    nets : sequence of Block
        The blocks whose forward passes use the trained parameters (the same block may
        appear twice).
    params : sequence of Parameter
        The parameters to settle.
    """

    def __init__(self, nets: Sequence, params: Sequence):
        self.params = list(params)
        self.pending = False  # an inference pass ran since the last settle
        self.settled = 0  # how often parameters were settled (for tests and the docs)
        self._hooks = []
        self._filters = []
        if mkldnn_enabled():
            for net in {id(net): net for net in nets if net is not None}.values():
                self._hooks.append(net.register_forward_pre_hook(self._saw_pass))
                self._filters.append(_quiet_rehybridize(net))

    def _saw_pass(self, _block, _inputs) -> None:
        if not autograd.is_training():
            self.pending = True

    def settle(self) -> None:
        """Before a training step: after an inference pass, every parameter in the default
        layout again (the engine waited for first); else nothing, and no wait."""
        if not self.pending:
            return
        mx.nd.waitall()
        to_default_layout([array for param in self.params for array in param.list_data()])
        self.pending = False
        self.settled += 1

    def close(self) -> None:
        """Stop watching the nets."""
        for hook in self._hooks:
            hook.detach()
        self._hooks = []
        for entry in self._filters:
            if entry in warnings.filters:
                warnings.filters.remove(entry)
        self._filters = []


def _quiet_rehybridize(net):
    """Ignore MXNet's warning that `net` "is being hybridized while still having forward
    hook/pre-hook", and return the filter's entry (:data:`warnings.filters`).

    The warning names the block by its whole repr, every layer: a script that hybridizes
    again (GluonCV's SSD, each epoch) printed the model on every rank at each call. It
    warns that a child's hooks stop running once its parent is hybridized; the hook here is
    on the block that is called, where it still runs. Only the warning about a block of
    `net`'s class is ignored (the message starts with that class's name)."""
    warnings.filterwarnings(
        "ignore", message=re.escape(f'"{type(net).__name__}(') +
        r"[\s\S]*is being hybridized while still having forward hook", category=UserWarning)
    return warnings.filters[0]
