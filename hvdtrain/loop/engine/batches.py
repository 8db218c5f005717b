"""One batch over a worker's devices, including batches smaller than the device count, and
the gradients of devices that got no part of it."""
from __future__ import annotations

import mxnet as mx
from mxnet import gluon

from ...store.gluon_internals import backward_ran, empty_gradients


def split_batch(images, labels, devices, dtype="float32"):
    """Split one numpy batch over `devices` as evenly as it goes.

    A batch with fewer samples than devices (an epoch's last one) goes to the first
    ``len(labels)`` devices; MXNet's ``split_and_load`` would fail on it.

    Returns
    -------
    (list of NDArray, list of NDArray, list of Context)
        Images and labels per used device, and the devices left idle.
    """
    used = devices[:max(1, min(len(devices), len(labels)))]
    # The batch travels as the loader made it and is cast on the device, after the copy:
    # a cast in numpy here would cost the main thread about as long as a GPU step.
    xs = [x.astype(dtype, copy=False) for x in
          gluon.utils.split_and_load(mx.nd.array(images, dtype=images.dtype), used,
                                     even_split=False)]
    # Labels stay float32 whatever the images' dtype: float16 holds integers exactly only
    # up to 2048, and class 2049 would become 2048.
    ys = [y.astype("float32", copy=False) for y in
          gluon.utils.split_and_load(mx.nd.array(labels, dtype=labels.dtype), used,
                                     even_split=False)]
    return xs, ys, devices[len(used):]


def settle_idle_devices(params, num_devices: int) -> int:
    """Give every device on which no backward pass ran since the last update (its rank's
    whole batch was unusable, or a batch smaller than the devices left it without a part)
    the gradients of a backward pass over nothing: zeros, marked fresh
    (:func:`~hvdtrain.store.gluon_internals.empty_gradients`). The store sums every device's
    and every rank's copy, and the Trainer refuses stale ones. Returns how many devices it
    settled.

    A device counts as idle when none of `params` (those that take a gradient) was written
    there: one a backward pass reached is left alone, whatever it holds."""
    trained = [p for p in params if p.grad_req != "null"]
    settled = 0
    for device in range(num_devices):
        if trained and not any(backward_ran(p, device) for p in trained):
            empty_gradients(trained, device)
            settled += 1
    return settled


def accumulate_gradients(net) -> None:
    """Make backward *add* to `net`'s gradients (``grad_req='add'``) instead of overwriting
    them, so several micro-batches sum into one gradient before one exchange.

    Call it before the Trainer sets up its store: changing ``grad_req`` re-creates the
    gradient arrays, and a :class:`~hvdtrain.store.buckets.BucketedTrainer` set up before
    would have to plan its buckets again."""
    for param in net.collect_params().values():
        if param.grad_req != "null":
            param.grad_req = "add"


def clear_gradients(net) -> None:
    """Zero `net`'s accumulated gradients in place (after an exchange and update), so the
    next micro-batch starts a new sum. In place: the zero-copy buckets hold views of them."""
    for param in net.collect_params().values():
        if param.grad_req == "add":
            param.zero_grad()
