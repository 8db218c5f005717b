"""How a batch becomes a forward and backward pass: MXNet's ``BatchProcessor``, distributed.

A processor has MXNet's two methods, ``fit_batch`` and ``evaluate_batch`` (each returning
``(data, label, pred, loss)``, lists with one entry per device), and hvdtrain asks one more
thing of it: ``batch_samples(batch, batch_axis)``, how many samples a batch holds, which the
ranks sum every step into the update's divisor (the global batch). A processor written for
MXNet's Estimator works unchanged when its batches are ``(data, label)`` or any structure
whose first array has the samples along ``batch_axis``; one whose batches hold a
different count (dicts whose first entry is not per sample, padded sequences counted
otherwise) says so by overriding ``batch_samples`` (in samples, objects or tokens: the
unusable samples are counted from what the loader left out, never from it).

A processor whose loss divides its own gradient by a count of the batch (GluonCV's
``SoftmaxCrossEntropyLoss`` at ``size_average=True``: the labels not ignored;
``SSDMultiBoxLoss``: the positive anchors) would be divided by each rank's own count on N
ranks. It says by what with an optional ``loss_divisor(batch, out)``: a number (every
device part's gradient divided by it) or one per device part, a count >= 0, for every
batch. The engine makes each rank's gradients sums again and divides the step by the counts
summed over the ranks, so N ranks train as one process over the global batch
(:mod:`hvdtrain.loop.engine.divisors`). GluonCV's losses are recognised without one
(:mod:`hvdtrain.estimator.loss_divisors`).

The default processor differs from MXNet's in two places, both for the distributed run:

- a batch is split over the devices as evenly as it goes, onto as many devices as it has
  samples (MXNet's ``split_and_load`` refuses a batch that does not divide evenly, which a
  shard's last batch often is); a device left without a part adds zero gradients;
- the backward pass goes through ``estimator.backward(losses)``, where AMP's loss scaling
  applies when it is on. A ``fit_batch`` of your own calls ``estimator.backward`` too;
  under AMP, one that calls ``loss.backward()`` itself is refused at its first batch.
"""
from __future__ import annotations

from mxnet import autograd, gluon
from mxnet.gluon.contrib.estimator import batch_processor as mx_batch_processor

import numpy as np

from ..config import ConfigError

__all__ = ["BatchProcessor", "split_over", "samples_in"]


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_output(out, samples: int, who: str, counted: bool = True) -> None:
    """Refuse, in one line, a ``fit_batch``/``evaluate_batch`` result (`who` names it) that
    the engine cannot use: not (data, label, pred, loss); labels, predictions and losses in
    different numbers of parts; or (`counted`) losses for another number of samples than
    the batch holds (`samples`, its ``batch_samples``). The engine sums the losses into the
    epoch's mean and divides the summed gradient by the step's sample count, so a loss must
    be one value per sample: a loss averaged over the batch would shrink both by the batch
    size. Not `counted`: a batch whose loss divisor is 0, whose gradient counts for nothing.
    Shapes only: nothing waits for the device."""
    if not isinstance(out, (list, tuple)) or len(out) != 4:
        raise ConfigError(f"{who} must return (data, label, pred, loss), each a list with one "
                          f"entry per device part; it returned {type(out).__name__}"
                          f"{f' of {len(out)}' if isinstance(out, (list, tuple)) else ''}")
    _, label, pred, loss = (_as_list(part) for part in out)
    if not len(label) == len(pred) == len(loss):
        raise ConfigError(f"{who} returned {len(label)} label, {len(pred)} prediction and "
                          f"{len(loss)} loss part(s): one of each per device part")
    if not counted:
        return
    counted = sum(int(part.shape[0]) if len(part.shape) else 1 for part in loss)
    if counted != samples:
        shapes = ", ".join(str(tuple(part.shape)) for part in loss)
        raise ConfigError(f"{who} returned losses of shape {shapes}: {counted} value(s) for a "
                          f"batch of {samples} sample(s) (batch_samples); return one loss per "
                          f"sample (a Gluon loss does), not their mean, or override "
                          f"batch_samples if the batch counts its samples otherwise")


def samples_in(batch, batch_axis: int = 0) -> int:
    """How many samples `batch` holds: the length along `batch_axis` of its first array
    (a batch may be an array, or tuples, lists and dicts of them; None, an empty batch
    of a shard whose every sample was unusable, holds none)."""
    first = _first_array(batch)
    if first is None:
        return 0
    shape = first.shape
    return int(shape[batch_axis]) if len(shape) > batch_axis else 0


def _first_array(batch):
    if batch is None:
        return None
    if hasattr(batch, "shape"):
        return batch
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for part in batch:
            found = _first_array(part)
            if found is not None:
                return found
    return None


def split_over(array, devices, batch_axis: int = 0) -> list:
    """`array` (an NDArray or numpy array) split along `batch_axis` over `devices` as evenly
    as it goes, onto the first ``min(len(devices), samples)`` of them."""
    size = array.shape[batch_axis]
    used = devices[:max(1, min(len(devices), size))]
    if isinstance(array, np.ndarray):
        array = _ndarray(array)
    return gluon.utils.split_and_load(array, used, batch_axis=batch_axis, even_split=False)


def _ndarray(array: np.ndarray):
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    return mx.nd.array(array, dtype=array.dtype)


class BatchProcessor(mx_batch_processor.BatchProcessor):
    """MXNet's BatchProcessor for ``(data, label)`` batches, split for a distributed run
    (see the module). Subclass it and override ``fit_batch``/``evaluate_batch`` (and
    ``batch_samples``, if a batch's first array does not hold its samples) for other
    batches: several inputs, dicts, per-sample weights."""

    def _get_data_and_label(self, batch, ctx, batch_axis=0):
        data, label = batch[0], batch[1]
        return split_over(data, ctx, batch_axis), split_over(label, ctx, batch_axis)

    def batch_samples(self, batch, batch_axis: int = 0) -> int:
        """How many samples `batch` holds (:func:`samples_in`)."""
        return samples_in(batch, batch_axis)

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        """Forward and backward of one training batch (see MXNet's
        ``BatchProcessor.fit_batch``); the backward pass through ``estimator.backward``."""
        data, label = self._get_data_and_label(train_batch, estimator.context, batch_axis)
        with autograd.record():
            pred = [estimator.net(x) for x in data]
            loss = [estimator.loss(y_hat, y) for y_hat, y in zip(pred, label)]
        estimator.backward(loss)
        return data, label, pred, loss

    def evaluate_batch(self, estimator, val_batch, batch_axis=0):
        """The validation net and loss over one batch (see MXNet's
        ``BatchProcessor.evaluate_batch``)."""
        data, label = self._get_data_and_label(val_batch, estimator.context, batch_axis)
        pred = [estimator.val_net(x) for x in data]
        loss = [estimator.val_loss(y_hat, y) for y_hat, y in zip(pred, label)]
        return data, label, pred, loss
