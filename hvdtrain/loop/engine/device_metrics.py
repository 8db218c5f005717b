"""Metrics whose running sums stay on the device until they are read.

MXNet's own metrics copy every batch's labels and predictions to the host (``asnumpy``) to
update: each update waits for the device, so steps are serialised by host syncs. These are
:class:`mxnet.metric.EvalMetric` subclasses, usable wherever one is (handlers, ``get()``),
that queue their arithmetic on the device instead: ``sum_metric`` is read (and waited for)
only when asked, at log intervals and at an epoch's end, where the ranks sum them
(:mod:`.metrics`; their state is ``sum_metric`` and ``num_inst``, :data:`.metric_states.MEAN`).
The sample counts come from shapes, which the host knows without waiting.

Each carries a ``record_name`` (``acc``, ``top5``, ``loss``): its field in ``metrics.jsonl``
after the split's prefix (``train_acc``, ``test_top5``).
"""
from __future__ import annotations

from typing import Optional

import mxnet as mx
from mxnet.metric import EvalMetric


class DeviceMetric(EvalMetric):
    """An EvalMetric whose sums are NDArrays on the device of its first update.

    Parameters
    ----------
    name : str
        Its display name (``get()``'s first element).
    record_name : str, optional
        Its field in ``metrics.jsonl``, after the split's prefix.
    log_name : str, optional
        How the epoch's log line names it (default: the split and the record name, "train
        acc"); "" leaves it out of the line.
    """

    def __init__(self, name: str, record_name: Optional[str] = None,
                 log_name: Optional[str] = None):
        self.record_name = record_name
        self.log_name = log_name
        super().__init__(name)

    # sum_metric and global_sum_metric: host floats (0 after a reset, or the ranks' sums
    # written back) or device NDArrays (sums of updates since).
    @property
    def sum_metric(self) -> float:
        return _value(self._sum)

    @sum_metric.setter
    def sum_metric(self, value) -> None:
        self._sum = value

    @property
    def global_sum_metric(self) -> float:
        return _value(self._global_sum)

    @global_sum_metric.setter
    def global_sum_metric(self, value) -> None:
        self._global_sum = value

    def device_sums(self):
        """(local sum, global sum) as they are held: NDArrays on the device or floats,
        not waited for."""
        return self._sum, self._global_sum

    def _add(self, amount: mx.nd.NDArray, count: int) -> None:
        """Add `amount` (a (1,) float32 NDArray) and `count` samples."""
        amount = amount.astype("float32", copy=False)
        self._sum = amount if _empty(self._sum) else self._sum + amount.as_in_context(
            self._sum.context)
        self._global_sum = amount if _empty(self._global_sum) else \
            self._global_sum + amount.as_in_context(self._global_sum.context)
        self.num_inst += count
        self.global_num_inst += count


def _empty(total) -> bool:
    return not isinstance(total, mx.nd.NDArray) and not total


def _value(total) -> float:
    if isinstance(total, mx.nd.NDArray):
        return float(total.asscalar())
    return float(total)


def _pairs(labels, preds):
    labels = labels if isinstance(labels, (list, tuple)) else [labels]
    preds = preds if isinstance(preds, (list, tuple)) else [preds]
    if len(labels) != len(preds):
        raise ValueError(f"{len(labels)} label arrays for {len(preds)} prediction arrays")
    return zip(labels, preds)


class DeviceAccuracy(DeviceMetric):
    """Share of samples whose highest score is their label (the argmax in float32: a float16
    argmax rounds class indices above 2048)."""

    def __init__(self, name: str = "accuracy", record_name: Optional[str] = "acc",
                 log_name: Optional[str] = None):
        super().__init__(name, record_name, log_name)

    def update(self, labels, preds):
        for label, pred in _pairs(labels, preds):
            hits = (pred.astype("float32", copy=False).argmax(axis=1) ==
                    label.astype("float32", copy=False).reshape((-1,))).sum()
            self._add(hits, int(label.shape[0]))


class DeviceTopK(DeviceMetric):
    """Share of samples whose label is among their `k` highest scores (every one when there
    are at most `k` classes)."""

    def __init__(self, k: int = 5, name: Optional[str] = None,
                 record_name: Optional[str] = None, log_name: Optional[str] = None):
        self.k = int(k)
        super().__init__(name or f"top-{self.k}", record_name or f"top{self.k}", log_name)

    def update(self, labels, preds):
        for label, pred in _pairs(labels, preds):
            top = mx.nd.topk(pred, k=min(self.k, pred.shape[1]), axis=1)
            hits = (top == label.reshape((-1, 1)).astype(top.dtype)).sum()
            self._add(hits, int(label.shape[0]))


class DeviceLoss(DeviceMetric, mx.metric.Loss):
    """The mean of the per-sample losses it is given: a ``metric.Loss`` (its `preds` are
    the losses, its labels ignored), so that the Estimator's handlers give it the losses,
    not the predictions."""

    def __init__(self, name: str = "loss", record_name: Optional[str] = "loss",
                 log_name: Optional[str] = None):
        super().__init__(name, record_name, log_name)

    def update(self, _, preds):
        preds = preds if isinstance(preds, (list, tuple)) else [preds]
        for loss in preds:
            self._add(loss.sum(), int(loss.size))
