"""An independent reference for the training tests: a plain Gluon loop in one process.

Written from the documented semantics alone (docs/training.md, the sampler's docstring),
with nothing of hvdtrain's loop, stores, buckets, sampler or loaders:

- each epoch's order is ``numpy.random.default_rng([seed, epoch]).permutation(n)``;
- with ``--sampling strided``, N workers x batch b (x accumulate a) hold at optimizer step k
  exactly positions ``k*N*b*a .. (k+1)*N*b*a - 1`` of it, and an epoch's last step takes
  what is left: one *global batch* per step;
- a step averages the gradient over its global batch: a ``gluon.Trainer`` with
  ``kvstore=None`` (no store at all), ``step(samples in the global batch)``.

What a test hands in is input, not what is tested: the model's architecture (from
``hvdtrain.models``, built afresh here), the arrays the run started from (after hvdtrain's
initialisation and broadcast), and the dataset's arrays.
"""
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

CPU = mx.cpu(0)


def epoch_order(seed, epoch, length):
    """The documented shuffle of an epoch: the same on every rank."""
    return np.random.default_rng([seed, epoch]).permutation(length)


def global_batches(length, seed, global_batch, epochs=1, max_steps=None):
    """[(epoch, sample indices)] of each optimizer step: every epoch's order cut into
    `global_batch` positions, the last step of an epoch taking the rest; at most
    `max_steps` steps in all."""
    steps = []
    for epoch in range(epochs):
        order = epoch_order(seed, epoch, length)
        steps.extend((epoch, order[i:i + global_batch])
                     for i in range(0, length, global_batch))
    return steps[:max_steps]


def arrays(net):
    """{name: numpy array} of `net`'s parameters, named as ``save_parameters`` does."""
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def recorded_initialisation(monkeypatch):
    """{name: numpy array} that fills with the arrays hvdtrain's job starts its net from,
    when ``hvdtrain.job.initialize`` runs (an input of a reference, not what is tested)."""
    from hvdtrain import job  # what is recorded, not how the reference trains
    initial = {}
    real = job.initialize

    def initialize(net, *args, **kwargs):
        real(net, *args, **kwargs)
        initial.update(arrays(net))
    monkeypatch.setattr(job, "initialize", initialize)
    return initial


def plain_net(model, classes, initial, sample_shape):
    """A fresh, imperative (not hybridized) `model` holding the arrays `initial`."""
    from hvdtrain.models import build_model  # the architecture only
    net = build_model(model, classes)
    net.initialize(ctx=CPU)
    net(mx.nd.zeros((1,) + tuple(sample_shape), ctx=CPU))  # shapes, before loading values
    params = net._collect_params_with_prefix()  # pylint: disable=protected-access
    assert sorted(params) == sorted(initial), (sorted(params), sorted(initial))
    for name, param in params.items():
        param.set_data(mx.nd.array(initial[name], ctx=CPU))
    return net


def train_plain(model, initial, x, y, steps, lr, classes=10, momentum=0.9, wd=1e-4,
                lr_for_step=None, micro=None, shares=1, wire_dtype=None):
    assert not (micro and shares > 1), "micro-batches or shares, not both"
    """Train `model` from `initial` with SGD over `steps` (``global_batches``' list).

    Parameters
    ----------
    lr_for_step : callable, optional
        The learning rate of step k (counted from 0); `lr` throughout by default.
    micro : int, optional
        Feed each step's samples in chunks of `micro`, each backward *adding* to the
        gradients (``grad_req='add'``), zeroed after the step: accumulation as a Gluon
        user writes it. By default one backward pass over the whole global batch.
    shares : int
        With `shares` > 1 each step's gradient is the sum of `shares` separate backward
        passes, one per worker's part of the global batch (``index[r::shares]``, strided
        sampling), added in numpy: data parallelism as its definition states it. (The
        same sum as one pass over the whole batch up to rounding; but a net with ReLU and
        max pooling can turn a rounding difference into a large one where a unit sits at
        a tie: simple_cnn at 2 x 64 on digits did at its 4th step, from 7e-8 to 1e-4.)
    wire_dtype : numpy dtype, optional
        With `shares`: each part's gradient cast to it and the parts summed in it (e.g.
        ``numpy.float16``: what workers exchanging float16 gradients compute), then cast
        back to float32.

    Returns
    -------
    (dict, list of dict)
        The trained arrays, and per epoch ``{"steps", "train_loss", "train_acc",
        "samples"}`` over the samples of its steps, each at the weights of its step.
    """
    net = plain_net(model, classes, initial, x.shape[1:])
    trained = [p for p in net.collect_params().values() if p.grad_req != "null"]
    if micro:
        for param in trained:
            param.grad_req = "add"
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": lr, "momentum": momentum, "wd": wd},
                            kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    totals = {}

    def backward(index):
        data, label = mx.nd.array(x[index], ctx=CPU), mx.nd.array(y[index], ctx=CPU)
        with autograd.record():
            out = net(data)
            loss = loss_fn(out, label)
        loss.backward()
        return (float(loss.sum().asscalar()),
                int((out.argmax(axis=1) == label).sum().asscalar()))

    for k, (epoch, index) in enumerate(steps):
        if lr_for_step is not None:
            trainer.set_learning_rate(lr_for_step(k))
        if shares > 1:
            tallies, wire = [], None
            for r in range(shares):
                tallies.append(backward(index[r::shares]))
                sent = [p.grad().asnumpy().astype(wire_dtype or np.float32) for p in trained]
                wire = sent if wire is None else [a + b for a, b in zip(wire, sent)]
            for param, total in zip(trained, wire):
                param.grad()[:] = mx.nd.array(total.astype(np.float32), ctx=CPU)
        else:
            chunks = [index[i:i + micro] for i in range(0, len(index), micro)] \
                if micro else [index]
            tallies = [backward(chunk) for chunk in chunks]
        trainer.step(len(index))
        if micro:
            for param in trained:
                param.zero_grad()
        seen = totals.setdefault(epoch, {"steps": 0, "loss": 0.0, "correct": 0, "samples": 0})
        seen["steps"] += 1
        seen["loss"] += sum(t[0] for t in tallies)
        seen["correct"] += sum(t[1] for t in tallies)
        seen["samples"] += len(index)
    epochs = [{"steps": t["steps"], "samples": t["samples"],
               "train_loss": t["loss"] / t["samples"], "train_acc": t["correct"] / t["samples"]}
              for _, t in sorted(totals.items())]
    return arrays(net), epochs
