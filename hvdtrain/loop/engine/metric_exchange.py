"""How a :class:`~.metrics.MetricBook` moves the metric states that are not plain numbers:
arrays summed element by element, records merged (every rank's bytes travel through
:func:`hvdtrain.store.byte_exchange.gather_bytes`). The same result on every rank (rank
order throughout)."""
from __future__ import annotations

import numpy as np


def sum_arrays(values: list, metric, path: str):
    """Arrays summed element by element, zero-padded to the largest shape; a rank's 0 (a
    state that saw nothing) adds nothing."""
    arrays = [np.asarray(v) for v in values]
    shaped = [a for a in arrays if a.ndim]
    if not shaped:
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total
    if len({a.ndim for a in shaped}) > 1 or any(not a.ndim and a != 0 for a in arrays):
        raise RuntimeError(f"metric {metric.name!r}: {path!r} has shapes "
                           f"{[a.shape for a in arrays]} on the ranks, which do not add up")
    shape = tuple(max(a.shape[d] for a in shaped) for d in range(shaped[0].ndim))
    total = np.zeros(shape, np.result_type(*shaped))
    for array in shaped:
        total[tuple(slice(0, n) for n in array.shape)] += array
    return total


class _Numbers:
    """A list of numbers as one array on the wire (a list of numpy scalars pickles to
    dozens of bytes each)."""

    def __init__(self, array):
        self.array = array


def packed(value):
    if isinstance(value, list) and value:
        array = np.asarray(value)
        if array.ndim == 1 and array.dtype.kind in "biuf":
            return _Numbers(array)
    if isinstance(value, dict):
        out = value.copy()  # a defaultdict keeps its default
        for key, item in value.items():
            out[key] = packed(item)
        return out
    return value


def unpacked(value):
    if isinstance(value, _Numbers):
        return list(value.array)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = unpacked(item)
    return value


def merged(mine, other, metric, path: str):
    """Records of two ranks: lists concatenated, dicts merged key by key, numbers added."""
    if isinstance(mine, list) and isinstance(other, list):
        return mine + other
    if isinstance(mine, dict) and isinstance(other, dict):
        for key, item in other.items():
            mine[key] = merged(mine[key], item, metric, path) if key in mine else item
        return mine
    if isinstance(mine, (int, float, np.number)) and isinstance(other, (int, float, np.number)):
        return mine + other
    raise RuntimeError(f"metric {metric.name!r}: records {path!r} of kinds "
                       f"{type(mine).__name__} and {type(other).__name__} cannot be merged")
