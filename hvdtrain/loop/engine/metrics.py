"""Metrics reduced over the ranks: every rank reports the figures of the whole split, each
sample counted once.

Each rank updates its metrics with its own shard's batches; a :class:`MetricBook` reduces
every metric's state over the ranks at the same point on every rank (an epoch's end, an
evaluation's end) and writes the result back, so ``get()`` then says the same on every rank:
what the metric would say over every rank's samples together. What a metric's state is,
and how it is reduced, is :mod:`.metric_states`' registry: ``sum_metric`` and ``num_inst``
for a mean (accuracy, top-k, cross-entropy, perplexity, the loss, hvdtrain's device metrics,
a user's metric that adds to them), confusion counts, summed arrays or gathered records for
the others. A composite's metrics are reduced one by one (its ``get()`` then reports them
all). A metric whose state cannot be reduced is refused in one line when the book is made,
before the first step.

The numbers travel in one exact float64 collective for the whole book (the sample counts of
an evaluation with them); the arrays and records of the metrics that have them, pickled, in
a second one.

Each metric's fields in ``metrics.jsonl`` are named after it (:func:`record_name`), made
unique within the book and never one of the run's own fields of the split (`reserved`:
``loss``, ``samples``, ...): such a name gets ``_metric`` appended (``train_loss_metric``
for ``mx.metric.Loss()``), and a name taken by an earlier metric ``_2``, ``_3``, ...
"""
from __future__ import annotations

import copy
import pickle
from typing import Dict, List, Sequence

import mxnet as mx
import numpy as np

from ...config import ConfigError
from ...store.dist import DistContext
from ...store.byte_exchange import gather_bytes
from .metric_exchange import merged, packed, sum_arrays, unpacked
from .metric_states import field_name, fields_of, leaves, state_of, values_of

COLLECTIVE_NAME = "metric_sums"
FIELDS = "_hvdtrain_fields"  # set on each metric: its fields in the book's records
# The run's own fields of each split in metrics.jsonl and TensorBoard, after the split's
# prefix (train_loss, train_samples, train_samples_per_sec, train_lr; val_samples).
TRAIN_FIELDS = ("loss", "samples", "samples_per_sec", "lr")
VAL_FIELDS = ("samples",)


def record_name(metric) -> str:
    """A metric's (first) field name in ``metrics.jsonl``, after its split's prefix: the
    one its book gave it, else its own ``record_name`` (hvdtrain's metrics), else its name
    without the Estimator's "training" or "validation" in front, in lower case with
    underscores ("rmse", "l2loss")."""
    given = getattr(metric, FIELDS, None)
    if given:
        return given[0]
    own = getattr(metric, "record_name", None)
    if own:
        return own
    name = metric.name
    return field_name(name[-1] if isinstance(name, (list, tuple)) else name)


class MetricBook:
    """A run's metrics of one split, their updates and their reduction over the ranks.

    Parameters
    ----------
    metrics : sequence of EvalMetric
        Composites included; each kind checked against :mod:`.metric_states`.
    name : str
        Names its collectives, the same on every rank (a parameter server keeps one size
        for each name: each book has its own).
    reserved : sequence of str
        The run's own field names of this split (without its prefix), which no metric may
        take.
    strided : bool
        How the split is cut over the ranks, for records kept in sample order: rank r's
        n-th sample is the split's ``r + N n``-th (True), or rank r holds a block of its
        own (False).
    """

    def __init__(self, metrics: Sequence, name: str = COLLECTIVE_NAME,
                 reserved: Sequence[str] = (), strided: bool = True):
        self.metrics = list(metrics)
        self.name = name
        self.strided = strided
        self.leaves = [leaf for metric in self.metrics for leaf in leaves(metric)]
        self.states = [state_of(leaf) for leaf in self.leaves]
        taken = set(reserved)
        self.fields: List[List[str]] = []
        for leaf, state in zip(self.leaves, self.states):
            if state.prepare is not None:
                state.prepare(leaf)
            for path in state.sums + state.arrays + state.records:
                try:
                    _get(leaf, path)
                except AttributeError:
                    raise ConfigError(f"metric {leaf.name!r} ({type(leaf).__name__}) has no "
                                      f"{path!r}, which its registered state names") from None
            names = [_unique(n, taken) for n in fields_of(leaf, state)]
            setattr(leaf, FIELDS, names)
            self.fields.append(names)

    def knows(self, metric) -> bool:
        return any(metric is m for m in self.metrics + self.leaves)

    def update(self, metric, labels, preds) -> None:
        """``metric.update(labels, preds)`` (what the metric's reduction needs is kept by
        its own update, whoever calls it)."""
        metric.update(labels, preds)

    def reset(self) -> None:
        for metric in self.metrics:
            metric.reset()

    def reset_one(self, metric) -> None:
        metric.reset()

    def names(self) -> List[str]:
        """Every field of the book's metrics, in order (without the split's prefix)."""
        return [name for names in self.fields for name in names]

    def values(self) -> Dict[str, float]:
        """Each field's value (NaN for a metric that saw nothing)."""
        out = {}
        for leaf, state, names in zip(self.leaves, self.states, self.fields):
            out.update(zip(names, values_of(leaf, state, len(names))))
        return out

    def reduce(self, dist: DistContext, extra: Sequence[float] = ()) -> List[float]:
        """Reduce every metric's state over the ranks (and sum the `extra` numbers, e.g.
        sample counts) and write it back into the metrics; return the summed `extra`. Every
        rank must call it at the same point, with the same metrics. Under ``dist_async``
        (no collective) and alone each rank keeps its own."""
        together = dist.num_workers > 1 and dist.synchronous
        gathered = together and any(state.gathered for state in self.states)
        sums = [(leaf, path) for leaf, state in zip(self.leaves, self.states)
                for path in state.sums]
        held = [_get(leaf, path) for leaf, path in sums]
        numbers = [_number(value) for value in held]
        payload, lengths = b"", []
        if gathered:
            payload = pickle.dumps({i: ([_get(leaf, p) for p in state.arrays],
                                        [packed(_get(leaf, p)) for p in state.records])
                                    for i, (leaf, state) in enumerate(zip(self.leaves,
                                                                          self.states))
                                    if state.gathered}, protocol=4)
            lengths = [0.0] * dist.num_workers
            lengths[dist.rank] = float(len(payload))
        parts = numbers + lengths + [float(v) for v in extra]
        summed = parts
        if parts and together:
            # float64: counts and sums stay exact far beyond float32's 2**24.
            values = mx.nd.array(np.array(parts, np.float64), dtype="float64")
            summed = dist.sum_across_workers(f"{COLLECTIVE_NAME}.{self.name}",
                                             values).asnumpy().tolist()
        for (leaf, path), was, total in zip(sums, held, summed):
            _set(leaf, path, _like(was, total))
        if gathered:
            at = len(numbers)
            self._combine(gather_bytes(dist, f"metric_records.{self.name}", payload,
                                        [int(n) for n in summed[at:at + dist.num_workers]]))
        for leaf, state in zip(self.leaves, self.states):
            if state.after is not None:
                state.after(leaf)
        return summed[len(numbers) + len(lengths):]

    def _combine(self, payloads: List[bytes]) -> None:
        """Every rank's arrays summed and records merged, in rank order (the same result
        on every rank), into this rank's metrics."""
        ranks = [pickle.loads(p) for p in payloads]
        for i, (leaf, state) in enumerate(zip(self.leaves, self.states)):
            if not state.gathered:
                continue
            for k, path in enumerate(state.arrays):
                _set(leaf, path, sum_arrays([r[i][0][k] for r in ranks], leaf, path))
            if state.merge is not None:
                joined = state.merge(leaf, [{path: unpacked(r[i][1][k]) for k, path in
                                             enumerate(state.records)} for r in ranks],
                                     self.strided)
                if joined is not None:
                    for path, value in joined.items():
                        _set(leaf, path, value)
                    continue
                ranks = [pickle.loads(p) for p in payloads]  # unpacked in place above
            for k, path in enumerate(state.records):
                joined = unpacked(ranks[0][i][1][k])
                for other in ranks[1:]:
                    joined = merged(joined, unpacked(other[i][1][k]), leaf, path)
                _set(leaf, path, joined)


def _unique(name: str, taken: set) -> str:
    if name in taken:
        name += "_metric"
    base, count = name, 1
    while name in taken:
        count += 1
        name = f"{base}_{count}"
    taken.add(name)
    return name


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _set(obj, path: str, value) -> None:
    """Set a state, copying the objects on its path rather than changing them (F1's counts
    object): a copy of a metric's attributes, taken before a reduction, then restores what
    this rank had counted (checkpoint_handler.agreed_value)."""
    first, _, rest = path.partition(".")
    if not rest:
        setattr(obj, first, value)
        return
    inner = copy.copy(getattr(obj, first))
    _set(inner, rest, value)
    setattr(obj, first, inner)


def _number(value) -> float:
    if value is None:
        return 0.0
    if isinstance(value, mx.nd.NDArray):
        return float(value.asscalar())
    return float(value)


def _like(was, total: float):
    """`total` as the kind of number the state held (a count stays an int)."""
    if isinstance(was, (bool, int, np.integer)):
        return int(round(total))
    return float(total)
