"""MXNet's macro-averaged F1 and MCC over the ranks: the mean of the global batches' scores.

MXNet 1.9.1's ``F1(average='macro')`` and ``MCC(average='macro')`` report the mean, over the
batches they were updated with, of each batch's score. One process at batch N*b scores
batches of N*b samples; N ranks at batch b score batches of b each, and with the strided
split (docs/estimator.md) rank r's k-th batch is part of that one process's k-th batch. So
a book that takes such a metric (:mod:`.metric_states`) makes its own ``update`` also keep
each batch's confusion counts (true and false positives and negatives, one row a batch),
the ranks sum the rows by batch number, and the metric then reports the mean of the scores
of those summed rows: what one process reports at the global batch, whatever the world
size.
"""
from __future__ import annotations

import numpy as np
from mxnet import metric as mx_metric

from .element_errors import _Bound

BATCHES = "_hvdtrain_batch_counts"  # the rows' attribute on the metric
FIELDS = ("true_positives", "false_negatives", "false_positives", "true_negatives")


def keep_batch_counts(metric) -> None:
    """Make `metric`'s own update keep each batch's counts (counted by MXNet's own
    counting), and its resets forget them (once)."""
    if BATCHES in vars(metric):
        return
    setattr(metric, BATCHES, np.zeros((0, len(FIELDS))))
    metric.update = _Bound(_updated, metric)
    metric.reset = _Bound(_reset, metric, "reset")
    metric.reset_local = _Bound(_reset, metric, "reset_local")


def _updated(metric, labels, preds):
    # MXNet's macro update resets its counts (the global ones too) after each batch: this
    # batch's are counted beside it, by MXNet's own counting.
    stats = mx_metric._BinaryClassificationMetrics()  # pylint: disable=protected-access
    for label, pred in zip(*mx_metric.check_label_shapes(labels, preds, True)):
        stats.update_binary_stats(label, pred)
    type(metric).update(metric, labels, preds)
    row = np.array([[getattr(stats, name) for name in FIELDS]], np.float64)
    setattr(metric, BATCHES, np.vstack([getattr(metric, BATCHES), row]))


def _reset(metric, how: str):
    getattr(type(metric), how)(metric)
    setattr(metric, BATCHES, np.zeros((0, len(FIELDS))))


def batch_means(score):
    """``after`` of a macro F1 or MCC: its value from the (summed) rows, `score(stats)` of
    each row's counts; a row of zeros (a batch number no rank reached) counts for none."""
    def after(metric) -> None:
        rows = getattr(metric, BATCHES)
        rows = rows[rows.sum(axis=1) > 0]
        stats = mx_metric._BinaryClassificationMetrics()  # pylint: disable=protected-access
        total = 0.0
        for row in rows:
            for name, value in zip(FIELDS, row):
                setattr(stats, name, int(value))
            total += score(stats)
        metric.sum_metric = metric.global_sum_metric = total
        metric.num_inst = metric.global_num_inst = len(rows)
    return after
