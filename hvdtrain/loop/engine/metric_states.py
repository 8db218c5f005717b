"""How each kind of metric keeps its state, and how the ranks reduce it: one registry.

Every rank updates its metrics with its own shard's batches. For every rank to report the
whole split's value, each metric's *state* is reduced over the ranks, and ``get()`` then
reads the reduced state. A :class:`MetricState` says what that state is, in the manner of
torchmetrics' ``add_state(..., dist_reduce_fx=...)``:

- ``sums``: numbers (attribute paths, dotted for nested objects) summed over the ranks, in
  float64, in the one collective the book makes for all of them (counts stay exact);
- ``arrays``: numpy arrays summed element by element, zero-padded to the largest shape any
  rank has (a confusion matrix that grew on one rank);
- ``records``: lists concatenated in rank order, and dicts of them merged key by key (lists
  concatenated, numbers added), e.g. per-class detection records;
- ``after``: recomputes what ``get()`` reads from the reduced state (MXNet's micro F1 keeps
  ``sum_metric`` as the F1 of its counts times their number);
- ``fields``/``values``: the record's fields when ``get()`` is not ``(name, value)`` or
  ``(names, values)`` (GluonCV's SegmentationMetric returns ``(pixAcc, mIoU)``);
- ``prepare``: called once on each metric a book takes (MAE, MSE, RMSE: their own updates
  and resets also keep exact error sums per element, :mod:`.element_errors`).

Arrays and records travel pickled (a second collective, only for books that hold them).

:func:`state_of` finds a metric's state: the registration of its class or of the nearest
base class, else :data:`MEAN` (``sum_metric`` and ``num_inst``, and their ``global_``
pair: every metric whose value is a mean over what it saw). A class that defines its own
``get``, ``reset`` or ``reset_local`` keeps other state and must be registered (through
:func:`register_metric_state`); until then it is refused in one line before the first step,
as is a kind the engine cannot reduce (MXNet's micro-averaged PearsonCorrelation).
Registered here: MXNet's F1 and MCC (the confusion counts for ``average='micro'``; for
``'macro'``, each batch's counts summed by batch number over the ranks: MXNet's mean of the
batches' scores, of the global batches, as one process at the global batch reports it), PCC (its confusion matrix), Perplexity, MAE, MSE, RMSE,
and, by the names :mod:`hvdtrain.ecosystem` keeps (GluonCV is never imported), GluonCV's
SegmentationMetric (intersections, unions and pixel counts) and VOCMApMetric /
VOC07MApMetric (per-class records, merged in the order of the samples:
:mod:`.detection_order`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from mxnet import metric as mx_metric

from ... import ecosystem
from ...config import ConfigError
from .batch_scores import BATCHES, batch_means, keep_batch_counts
from .detection_order import SAMPLES, keep_sample_order, merge_in_sample_order
from .element_errors import ERRORS, keep_element_errors, per_element


@dataclass(frozen=True)
class MetricState:
    """What a metric's state is and how the ranks reduce it (see the module)."""

    sums: Tuple[str, ...] = ()
    arrays: Tuple[str, ...] = ()
    records: Tuple[str, ...] = ()
    after: Optional[Callable] = None  # after(metric): get()'s inputs from the reduced state
    fields: Optional[Tuple[str, ...]] = None  # the record's field names (default: its name)
    values: Optional[Callable] = None  # values(metric) -> floats, one per field
    prepare: Optional[Callable] = None  # prepare(metric): once, when a book takes it
    # merge(metric, [each rank's {record path: value}], strided) -> {path: value}, or None
    # for the records merged rank by rank (records kept in sample order)
    merge: Optional[Callable] = None
    refused: Optional[str] = None  # why this kind cannot be reduced (refused in one line)

    @property
    def gathered(self) -> bool:
        return bool(self.arrays or self.records)


MEAN = MetricState(sums=("sum_metric", "num_inst", "global_sum_metric", "global_num_inst"))
OWN_STATE = ("get", "reset", "reset_local")

_REGISTRY: Dict[str, Union[MetricState, Callable]] = {}


def class_key(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_metric_state(cls, state: Union[MetricState, Callable, None] = None, *,
                          sums: Sequence[str] = (), arrays: Sequence[str] = (),
                          records: Sequence[str] = (), after: Optional[Callable] = None,
                          fields: Optional[Sequence[str]] = None,
                          values: Optional[Callable] = None) -> None:
    """Say how the ranks reduce the state of metric class `cls` (a class, or its
    ``"module.QualName"``: nothing is imported). `state` is a :class:`MetricState`, or a
    function of a metric returning one (a state per instance, e.g. per ``average``); else
    one is made from the keywords. Subclasses inherit it unless they define their own
    ``get``/``reset``/``reset_local``.

    >>> register_metric_state(MyMetric, sums=["hits", "count"], arrays=["confusion"])
    """
    if state is None:
        state = MetricState(tuple(sums), tuple(arrays), tuple(records), after,
                            None if fields is None else tuple(fields), values)
    _REGISTRY[cls if isinstance(cls, str) else class_key(cls)] = state


def leaves(metric) -> List:
    """`metric`, or a composite's metrics (recursively): what holds state."""
    if isinstance(metric, mx_metric.CompositeEvalMetric):
        return [leaf for child in metric.metrics for leaf in leaves(child)]
    return [metric]


def flat_metrics(metrics):
    """A list of metrics with composites replaced by their metrics (None stays None)."""
    if metrics is None:
        return None
    if isinstance(metrics, mx_metric.EvalMetric):
        metrics = [metrics]
    return [leaf for metric in metrics for leaf in leaves(metric)] \
        if isinstance(metrics, (list, tuple)) else metrics


def state_of(metric) -> MetricState:
    """`metric`'s state; a kind the ranks cannot reduce is refused in one line."""
    kind = type(metric)
    for cls in kind.__mro__:
        if cls in (mx_metric.EvalMetric, object):
            break
        entry = _REGISTRY.get(class_key(cls))
        if entry is not None:
            state = entry if isinstance(entry, MetricState) else entry(metric)
            if state.refused:
                raise ConfigError(f"metric {_name(metric)!r} ({class_key(kind)}) {state.refused}")
            if state.prepare is not None and cls is not kind and _defines(kind, cls, "update"):
                break  # e.g. MAE's per-element sums mirror MAE's update, not a subclass's
            return state
        own = [name for name in OWN_STATE if name in vars(cls)]
        if own:
            raise ConfigError(
                f"metric {_name(metric)!r} ({class_key(kind)}) defines its own "
                f"{'/'.join(own)}, so its state is more than sum_metric and num_inst (what "
                f"the ranks sum by default) and no rank could report it over the whole "
                f"split: say how the ranks reduce it, e.g. hvdtrain.estimator."
                f"register_metric_state({kind.__qualname__}, sums=[...], arrays=[...], "
                f"records=[...]) "
                f"(docs/estimator.md, \"The metrics\")")
    return MEAN


def _defines(kind, base, name: str) -> bool:
    """Whether a class between `kind` and `base` (exclusive) defines `name`."""
    for cls in kind.__mro__:
        if cls is base:
            return False
        if name in vars(cls):
            return True
    return False


def _name(metric) -> str:
    name = metric.name
    return ", ".join(map(str, name)) if isinstance(name, (list, tuple)) else str(name)


def field_name(name) -> str:
    """A name as a record's field: without the Estimator's "training"/"validation" in
    front, in lower case with underscores ("rmse", "l2loss")."""
    name = str(name)
    for prefix in ("training ", "validation "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return "_".join(name.lower().replace("-", " ").split()) or "metric"


def fields_of(metric, state: MetricState) -> List[str]:
    """The record's field names of one metric (before the book makes them unique)."""
    if state.fields is not None:
        return list(state.fields)
    own = getattr(metric, "record_name", None)
    if own:
        return [own]
    if isinstance(metric.name, (list, tuple)):
        return [field_name(n) for n in metric.name]
    return [field_name(metric.name)]


def values_of(metric, state: MetricState, count: int) -> List[float]:
    """One metric's values, one per field; NaN when it saw nothing."""
    if state.values is not None:
        values = state.values(metric)
    else:
        _, values = metric.get()
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if len(values) != count:
        raise RuntimeError(f"metric {_name(metric)!r} reported {len(values)} value(s) for "
                           f"{count} field(s)")
    return [float(v) for v in values]


# --- MXNet's metrics -------------------------------------------------------------------

def _binary(counts: str, average: str, score: Callable) -> Callable:
    """F1's or MCC's state: the confusion counts (micro), or each batch's counts summed by
    batch number over the ranks (macro: the mean of the global batches' scores,
    :mod:`.batch_scores`)."""
    names = ("true_positives", "false_negatives", "false_positives", "true_negatives")
    micro = MetricState(
        sums=tuple(f"{counts}.{p}{n}" for p in ("", "global_") for n in names),
        after=lambda m: _from_counts(m, getattr(m, counts), score))
    macro = MetricState(arrays=(BATCHES,),
                        after=batch_means(lambda stats: score(stats, False)),
                        prepare=keep_batch_counts)
    return lambda m: macro if getattr(m, average) == "macro" else micro


def _from_counts(metric, counts, score: Callable) -> None:
    """As MXNet's micro average sets them at each update, from the reduced counts."""
    metric.sum_metric = score(counts, False) * counts.total_examples
    metric.global_sum_metric = score(counts, True) * counts.global_total_examples
    metric.num_inst = counts.total_examples
    metric.global_num_inst = counts.global_total_examples


def _grown(metric) -> None:
    """PCC: both matrices of the largest size any rank grew them to."""
    k = max(metric.lcm.shape[0], metric.gcm.shape[0], metric.k)
    metric.lcm, metric.gcm = (np.pad(c, ((0, k - c.shape[0]), (0, k - c.shape[0])),
                                     "constant") for c in (metric.lcm, metric.gcm))
    metric.k = k


def _pearson(metric) -> MetricState:
    if metric.average == "macro":
        return MEAN
    return MetricState(refused="with average='micro' keeps running moments that hvdtrain "
                       "does not merge over the ranks: use average='macro' (the mean of "
                       "the batches' correlations, summed over the ranks), or register a "
                       "metric of your own (hvdtrain.estimator.register_metric_state)")


def _voc_values(metric) -> List[float]:
    """VOC mAP's values; NaN for each when it saw no box (its get() would fail)."""
    if not getattr(metric, ecosystem.VOC_POSITIVES):
        return [float("nan")] * (1 if metric.num is None else metric.num)
    return metric.get()[1]


VOC = MetricState(records=(ecosystem.VOC_POSITIVES,) + ecosystem.VOC_RECORDS + (SAMPLES,),
                  values=_voc_values,
                  prepare=keep_sample_order, merge=merge_in_sample_order)

register_metric_state(mx_metric.F1, _binary("metrics", "average",
                                            lambda c, g: c.global_fscore if g else c.fscore))
register_metric_state(mx_metric.MCC, _binary("_metrics", "_average",
                                             lambda c, g: c.matthewscc(use_global=g)))
register_metric_state(mx_metric.PCC, sums=("num_inst", "global_num_inst"),
                      arrays=("lcm", "gcm"), after=_grown)
register_metric_state(mx_metric.Perplexity, MEAN)
register_metric_state(mx_metric.PearsonCorrelation, _pearson)
for _cls, _kind in ((mx_metric.MAE, "absolute"), (mx_metric.MSE, "squared"),
                    (mx_metric.RMSE, "squared")):
    register_metric_state(_cls, MetricState(
        sums=(f"{ERRORS}.total", f"{ERRORS}.elements"), after=per_element,
        prepare=functools.partial(keep_element_errors, kind=_kind)))
# --- GluonCV's, by name (hvdtrain.ecosystem) ------------------------------------------
register_metric_state(ecosystem.GLUONCV_SEGMENTATION_METRIC,
                      sums=ecosystem.SEGMENTATION_SUMS, arrays=ecosystem.SEGMENTATION_ARRAYS,
                      fields=ecosystem.SEGMENTATION_FIELDS, values=lambda m: list(m.get()))
for _name_of_class in ecosystem.GLUONCV_VOC_METRICS:
    register_metric_state(_name_of_class, VOC)
