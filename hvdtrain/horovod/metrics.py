"""One line to report a metric of the whole split: ``hvd.allreduce_metric(metric)``.

A script's metric sees its own rank's batches: under ``horovod.mxnet`` (and, unchanged,
under ``hvdtrain.horovod``) each rank reports its own figure. :func:`allreduce_metric`
reduces any ``EvalMetric`` (composites included) over the ranks through hvdtrain's metric
registry (:mod:`hvdtrain.loop.engine.metric_states`): sums and counts summed, confusion
counts and arrays summed, detection records gathered. Every rank then reports the figure
one process would over every rank's samples.
"""
from __future__ import annotations

from ..loop.engine.metrics import MetricBook
from . import session as sessions


def allreduce_metric(metric, name="metric", strided=False):
    """Reduce `metric` over the ranks, in place, and return ``metric.get()``.

    Every rank calls it at the same point with the same kind of metric (at the end of a
    validation pass, say). The metric then holds the whole split's state: reset it before
    it counts again (a second reduction would count the first one's samples twice).
    A metric whose state hvdtrain does not know is refused in one line
    (:func:`hvdtrain.estimator.register_metric_state` teaches it one).

    Parameters
    ----------
    metric : mxnet.metric.EvalMetric
        The metric, updated by this rank with its own batches.
    name : str
        Names the collectives: the same on every rank.
    strided : bool
        How the script split its samples, for records kept in sample order (detections):
        each rank a block of its own (False, as GluonCV's ``SplitSampler``), or rank r the
        samples ``r, r + N, ...`` (True). Records are noted with their sample from the
        metric's first reduction on: for ``strided=True`` reduce the fresh metric once
        before its first update (without notes the records keep rank order).
    """
    session = sessions.current()
    with session.calling("allreduce_metric"):
        MetricBook([metric], name=f"hvdtrain.horovod.{name}",
                   strided=strided).reduce(session.dist)
    return metric.get()
