"""The private corners of MXNet 1.9's Gluon that hvdtrain relies on, in one place.

Gluon has no public way to set up a Trainer's store before its first step
(:func:`set_up_store`), or to give a parameter a gradient array of the caller's choosing
(:func:`rehome_gradient`). Both are needed (the broadcast before
the first forward pass, zero-copy gradient buckets), so the private calls live here,
behind a version check: a different MXNet fails loudly at import instead of training
subtly wrong.
"""
from __future__ import annotations

import mxnet as mx
from mxnet import autograd

SUPPORTED = ("1.9.",)
if not mx.__version__.startswith(SUPPORTED):
    raise ImportError(f"hvdtrain uses Gluon internals of MXNet {', '.join(SUPPORTED)}x; "
                      f"found MXNet {mx.__version__}")


def rehome_gradient(param, device: int, grad: mx.nd.NDArray) -> None:
    """Make `grad` the gradient array of `param` on its `device`-th context.

    Backward writes into whatever array autograd has marked for the parameter's data, so
    `grad` may be a view into a larger buffer; its values are the caller's to set.
    """
    grads = param.list_grad()
    if grads[device].shape != grad.shape or grads[device].dtype != grad.dtype:
        raise ValueError(f"{param.name}: gradient {grad.shape} {grad.dtype} does not match "
                         f"{grads[device].shape} {grads[device].dtype}")
    data = param.list_data()
    # Marking resets autograd's "backward has written this gradient" flags, which the
    # Trainer's stale-gradient check reads: keep them as they were.
    fresh = [array._fresh_grad for array in data]  # pylint: disable=protected-access
    param._grad[device] = grad  # pylint: disable=protected-access
    autograd.mark_variables(data, param.list_grad(), param.grad_req)
    for array, flag in zip(data, fresh):
        array._fresh_grad = flag  # pylint: disable=protected-access


def set_up_store(trainer, batch_size: int) -> None:
    """Run now what a Trainer's first ``step(batch_size)`` would run before its update:
    gradient scaling, the store's set-up and the parameters' first broadcast.

    The Trainer has no public hook for "set up the store now"."""
    trainer._check_and_rescale_grad(trainer._scale / batch_size)  # pylint: disable=protected-access
    if not trainer._kv_initialized:  # pylint: disable=protected-access
        trainer._init_kvstore()  # pylint: disable=protected-access
    trainer._init_params()  # pylint: disable=protected-access
