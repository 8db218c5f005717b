"""One batch over a worker's devices, including batches smaller than the device count."""
from __future__ import annotations

import mxnet as mx
from mxnet import autograd, gluon


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


def zero_gradients(net, sample, device):
    """Write zero gradients, as fresh ones, on a `device` that got no part of the batch:
    the Trainer refuses stale gradients, and the store sums every device's copy.

    They come from the backward pass of a zero loss on one `sample`, so only public API is
    used. Forward and backward both run in predict mode, which keeps BatchNorm's running
    statistics out of it (MXNet 1.x moves them in the backward pass).
    """
    sample = sample.as_in_context(device)
    with autograd.record(train_mode=False):
        zero = net(sample).sum() * 0
    autograd.backward([zero], train_mode=False)


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
