"""Metrics reduced over the ranks: every rank reports the figures of the whole split, each
sample counted once.

An MXNet :class:`~mxnet.metric.EvalMetric` keeps a running sum and a count (``sum_metric``,
``num_inst``, and the ``global_`` pair that ``reset_local`` leaves alone), and reports their
ratio. Each rank updates its metrics with its own shard's batches; a :class:`MetricBook`
sums every metric's pairs over the ranks, in one exact collective for all of them, and
writes the totals back, so ``get()`` then says the same on every rank: what the metric would
say over every rank's samples together. That is exact for every metric whose sum adds up
over samples (accuracy, top-k, cross-entropy, perplexity, the loss, hvdtrain's device
metrics, a user's own metric that follows the same protocol).

Two kinds do not follow it:

- MXNet 1.9.1's ``MAE``, ``MSE`` and ``RMSE`` add one value *per batch* (``num_inst += 1``):
  their ratio is a mean of batch means, which depends on how the split was batched, and
  RMSE's a mean of square roots. The book keeps their errors' sums per element instead
  (queued on the device) and writes back the value over the whole split: the mean absolute
  or squared error of every element, and its square root for RMSE.
- ``F1``, ``MCC``, ``PearsonCorrelation`` and ``PCC`` keep state that no sum of pairs can
  reduce (counts of a confusion, running moments); they are refused in one line.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

import mxnet as mx
import numpy as np
from mxnet import metric as mx_metric

from ...config import ConfigError
from ...store.dist import DistContext
from .device_metrics import DeviceMetric

COLLECTIVE_NAME = "metric_sums"
PER_ELEMENT = {mx_metric.MAE: "absolute", mx_metric.MSE: "squared",
               mx_metric.RMSE: "squared"}
REFUSED = (mx_metric.F1, mx_metric.MCC, mx_metric.PearsonCorrelation, mx_metric.PCC)


def check_reducible(metrics: Sequence) -> None:
    """Refuse, in one line, a metric whose state the ranks cannot sum (see the module)."""
    for metric in metrics:
        if isinstance(metric, REFUSED):
            raise ConfigError(
                f"metric {metric.name!r} ({type(metric).__name__}) keeps state the ranks cannot "
                f"sum (its counts or moments, not sum_metric and num_inst), so no rank could "
                f"report it over the whole split: use metrics that add up over samples "
                f"(Accuracy, TopKAccuracy, CrossEntropy, Loss, MAE, MSE, RMSE, or your own "
                f"EvalMetric that adds to sum_metric and num_inst), or compute it from saved "
                f"predictions after training")


def record_name(metric) -> str:
    """A metric's field name in ``metrics.jsonl``, after its split's prefix: its own
    ``record_name`` (hvdtrain's metrics), else its name without the Estimator's "training"
    or "validation" in front, in lower case with underscores ("rmse", "l2loss")."""
    own = getattr(metric, "record_name", None)
    if own:
        return own
    name = metric.name
    for prefix in ("training ", "validation "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return "_".join(name.lower().replace("-", " ").split()) or "metric"


class ElementErrors:
    """Exact sums of an MAE, MSE or RMSE: absolute or squared errors, and elements."""

    def __init__(self, kind: str):
        self.kind = kind
        self.reset()

    def reset(self) -> None:
        self.total = None  # NDArray (1,) on the first update's device
        self.elements = 0

    def update(self, labels, preds) -> None:
        labels = labels if isinstance(labels, (list, tuple)) else [labels]
        preds = preds if isinstance(preds, (list, tuple)) else [preds]
        for label, pred in zip(labels, preds):
            # As MXNet's own: a vector is a column; labels and predictions then broadcast.
            if label.ndim == 1:
                label = label.reshape((-1, 1))
            if pred.ndim == 1:
                pred = pred.reshape((-1, 1))
            diff = mx.nd.broadcast_sub(label.astype("float32").as_in_context(pred.context),
                                       pred.astype("float32"))
            error = mx.nd.abs(diff) if self.kind == "absolute" else diff * diff
            size = error.size
            part = error.sum()
            self.total = part if self.total is None else self.total + part.as_in_context(
                self.total.context)
            self.elements += size


class MetricBook:
    """A run's metrics of one split, their updates and their reduction over the ranks.

    Parameters
    ----------
    metrics : sequence of EvalMetric
        Checked with :func:`check_reducible`.
    name : str
        Names its collective, the same on every rank (a parameter server keeps one size
        for each name: each book has its own).
    """

    def __init__(self, metrics: Sequence, name: str = COLLECTIVE_NAME):
        self.metrics = list(metrics)
        self.name = name
        check_reducible(self.metrics)
        self._errors: Dict[int, ElementErrors] = {
            id(m): ElementErrors(kind) for m in self.metrics
            for cls, kind in PER_ELEMENT.items() if type(m) is cls}  # pylint: disable=unidiomatic-typecheck

    def knows(self, metric) -> bool:
        return any(metric is m for m in self.metrics)

    def update(self, metric, labels, preds) -> None:
        """``metric.update(labels, preds)``, and its exact error sums where it has them."""
        metric.update(labels, preds)
        errors = self._errors.get(id(metric))
        if errors is not None:
            errors.update(labels, preds)

    def reset(self) -> None:
        for metric in self.metrics:
            self.reset_one(metric)

    def reset_one(self, metric) -> None:
        """Reset `metric` (one of the book's) and the exact sums kept beside it."""
        metric.reset()
        errors = self._errors.get(id(metric))
        if errors is not None:
            errors.reset()

    def reduce(self, dist: DistContext, extra: Sequence[float] = ()) -> List[float]:
        """Sum every metric's sums (and `extra` numbers, e.g. sample counts) over the ranks
        in one exact collective and write the totals back into the metrics; return the
        summed `extra`. Every rank must call it at the same point, with the same metrics.
        Under ``dist_async`` (no collective) each rank keeps its own."""
        parts, layout = [], []
        for metric in self.metrics:
            errors = self._errors.get(id(metric))
            if errors is not None:
                parts += [_host(errors.total), float(errors.elements)]
                layout.append(2)
            elif isinstance(metric, DeviceMetric):
                local, whole = metric.device_sums()
                parts += [_host(local), float(metric.num_inst), _host(whole),
                          float(metric.global_num_inst)]
                layout.append(4)
            else:
                parts += [float(metric.sum_metric), float(metric.num_inst),
                          float(metric.global_sum_metric), float(metric.global_num_inst)]
                layout.append(4)
        parts += [float(v) for v in extra]
        if not parts:
            return []
        # float64: counts and sums stay exact far beyond float32's 2**24.
        values = mx.nd.array(np.array(parts, np.float64), dtype="float64")
        if dist.num_workers > 1 and dist.synchronous:
            values = dist.sum_across_workers(self.name, values)
        summed = values.asnumpy().tolist()
        at = 0
        for metric, size in zip(self.metrics, layout):
            piece = summed[at:at + size]
            at += size
            if size == 2:
                _set_element_errors(metric, *piece)
            else:
                metric.sum_metric, metric.num_inst = piece[0], _count(piece[1])
                metric.global_sum_metric, metric.global_num_inst = piece[2], _count(piece[3])
        return summed[at:]

    def values(self) -> Dict[str, float]:
        """Each metric's value by its record name (:func:`record_name`); NaN when it saw
        nothing."""
        return {record_name(m): float(m.get()[1]) for m in self.metrics}


def _host(total) -> float:
    if total is None:
        return 0.0
    if isinstance(total, mx.nd.NDArray):
        return float(total.asscalar())
    return float(total)


def _count(value: float):
    return int(round(value))


def _set_element_errors(metric, total: float, elements: float) -> None:
    """Make an MAE, MSE or RMSE report the whole split's value per element."""
    elements = _count(elements)
    if not elements:
        metric.reset()
        return
    value = total / elements
    if isinstance(metric, mx_metric.RMSE):
        value = math.sqrt(value)
    # get() is sum_metric / num_inst: the count of elements and their mean times it.
    metric.num_inst = metric.global_num_inst = elements
    metric.sum_metric = metric.global_sum_metric = value * elements
