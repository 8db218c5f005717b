"""MAE, MSE and RMSE per element, whoever updates them.

MXNet 1.9.1's ``MAE``, ``MSE`` and ``RMSE`` add one value *per batch* (``num_inst += 1``):
their ratio is a mean of batch means, which depends on how the split was batched (over the
ranks, on the world size), and RMSE's a mean of square roots. A book that takes one
(:mod:`.metric_states`) makes the metric's own ``update``, ``reset`` and ``reset_local``
keep its errors' exact sums per element instead (queued on the device: MXNet's own update
reads the labels and predictions on the host, a wait every batch), so that a handler
that calls ``metric.update`` itself keeps them too, and its ``get`` report them (read
from the device when asked); the ranks sum them, and the metric then reports the whole
split's value per element: the mean absolute or squared error of every element, and its
square root for RMSE.
"""
from __future__ import annotations

import math

import mxnet as mx
from mxnet import metric as mx_metric

ERRORS = "_hvdtrain_element_errors"  # the sums' attribute on the metric


class ElementErrors:
    """Exact sums of an MAE's, MSE's or RMSE's absolute or squared errors, and elements."""

    def __init__(self, kind: str):
        self.kind = kind
        self.reset()

    def reset(self) -> None:
        self.total = 0.0  # an NDArray (1,) on the first update's device, or a float
        self.elements = 0

    def update(self, labels, preds) -> None:
        labels = labels if isinstance(labels, (list, tuple)) else [labels]
        preds = preds if isinstance(preds, (list, tuple)) else [preds]
        for label, pred in zip(labels, preds):
            # As MXNet's own: a vector is a column; labels and predictions then broadcast.
            label = label.reshape((-1, 1)) if label.ndim == 1 else label
            pred = pred.reshape((-1, 1)) if pred.ndim == 1 else pred
            diff = mx.nd.broadcast_sub(
                label.astype("float32", copy=False).as_in_context(pred.context),
                pred.astype("float32", copy=False))
            error = mx.nd.abs(diff) if self.kind == "absolute" else diff * diff
            part = error.sum()
            if isinstance(self.total, mx.nd.NDArray):
                part = self.total + part.as_in_context(self.total.context)
            elif self.total:  # the ranks' sum written back, then updated again
                part = part + self.total
            self.total = part
            self.elements += error.size


def keep_element_errors(metric, kind: str) -> None:
    """Make `metric`'s own update and resets keep its sums per element (once)."""
    if ERRORS in vars(metric):
        return
    setattr(metric, ERRORS, ElementErrors(kind))
    metric.update = _Bound(_updated, metric)
    metric.get = _Bound(_get, metric)
    metric.get_global = _Bound(_get, metric, "get_global")
    metric.reset = _Bound(_reset, metric)
    metric.reset_local = _Bound(_reset, metric, "reset_local")


def per_element(metric) -> None:
    """Make `metric` report its (reduced) sums' value per element."""
    errors = getattr(metric, ERRORS)
    if not errors.elements:
        metric.reset()
        return
    value = float(errors.total.asscalar() if isinstance(errors.total, mx.nd.NDArray)
                  else errors.total) / errors.elements
    value = math.sqrt(value) if isinstance(metric, mx_metric.RMSE) else value
    # get() is sum_metric / num_inst: the count of elements and their mean times it.
    metric.num_inst = metric.global_num_inst = errors.elements
    metric.sum_metric = metric.global_sum_metric = value * errors.elements


def _updated(metric, labels, preds):
    getattr(metric, ERRORS).update(labels, preds)


def _get(metric, how: str = "get"):
    per_element(metric)  # the sums kept so far, this rank's or (after a reduce) all ranks'
    return getattr(type(metric), how)(metric)


def _reset(metric, how: str = "reset"):
    getattr(type(metric), how)(metric)
    getattr(metric, ERRORS).reset()


class _Bound:
    """``function(metric, *args)`` as an instance's method, copied, deep-copied and pickled
    with the instance (a bound method's copy would still update the original)."""

    def __init__(self, function, metric, *args):
        self.function, self.metric, self.args = function, metric, args

    def __call__(self, *args, **kwargs):
        return self.function(self.metric, *self.args, *args, **kwargs)
