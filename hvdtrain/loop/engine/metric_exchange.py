"""How a :class:`~.metrics.MetricBook` moves the metric states that are not plain numbers:
every rank's bytes through one exact sum, arrays summed element by element, records merged.
The same result on every rank (rank order throughout)."""
from __future__ import annotations

from typing import List

import mxnet as mx
import numpy as np

from ...store.dist import DistContext


def gather_bytes(dist: DistContext, name: str, mine: bytes, lengths: List[int]) -> List[bytes]:
    """Every rank's bytes (`lengths`: each rank's count), through one sum: each rank puts
    its own, four bytes to a float64 (exact), in its own place of a zeroed buffer."""
    words = [-(-n // 4) for n in lengths]
    starts = np.cumsum([0] + words)
    buffer = np.zeros(int(starts[-1]), np.float64)
    rank = dist.rank
    padded = mine + b"\0" * (4 * words[rank] - len(mine))
    buffer[starts[rank]:starts[rank + 1]] = np.frombuffer(padded, "<u4")
    if buffer.size:  # the lengths are every rank's alike: so is the size
        buffer = dist.sum_across_workers(f"metric_records.{name}", mx.nd.array(
            buffer, dtype="float64")).asnumpy()
    return [buffer[starts[r]:starts[r + 1]].astype("<u4").tobytes()[:lengths[r]]
            for r in range(dist.num_workers)]


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
