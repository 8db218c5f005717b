"""Which rank updates which elements under the sharded optimizer state (:mod:`.sharded`).

Each gradient bucket is one flat buffer; its elements are split over the N ranks in N
contiguous, balanced slices, the way Horovod's ``reducescatter`` splits a first dimension:
``size // N`` elements each, the first ``size % N`` ranks one more. A slice may begin or end
inside a parameter, or span several: it is cut into *pieces*, one per parameter it touches,
each updated with that parameter's own rate and decay multipliers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple


def shard_bounds(size: int, ranks: int) -> List[Tuple[int, int]]:
    """The ``[start, stop)`` of each rank's slice of a flat buffer of `size` elements: in
    rank order, contiguous, covering it once; sizes differ by at most one element (the
    first ``size % ranks`` ranks hold one more), as Horovod's reducescatter splits."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    base, extra = divmod(size, ranks)
    bounds, start = [], 0
    for rank in range(ranks):
        stop = start + base + (rank < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class Piece:
    """The part of one parameter inside one rank's slice of a bucket."""

    param: int  # the parameter's position in the Trainer (the optimizer's index)
    start: int  # first element of the piece in the parameter, flattened
    stop: int  # one past its last
    offset: int  # where the piece begins in the rank's slice

    @property
    def size(self) -> int:
        return self.stop - self.start


def slice_pieces(params: Sequence[int], sizes: Sequence[int], start: int,
                 stop: int) -> List[Piece]:
    """The pieces of the slice ``[start, stop)`` of a bucket holding parameters `params`
    (Trainer positions) of `sizes` elements, laid out one after the other in that order."""
    pieces, begin = [], 0
    for param, size in zip(params, sizes):
        end = begin + size
        lo, hi = max(begin, start), min(end, stop)
        if lo < hi:
            pieces.append(Piece(param, lo - begin, hi - begin, lo - start))
        begin = end
    return pieces


def plan_shards(buckets: Sequence[Sequence[int]], sizes: Sequence[Sequence[int]],
                rank: int, ranks: int) -> List[List[Piece]]:
    """For each bucket (its parameters and their sizes in elements), the pieces `rank` of
    `ranks` updates."""
    plan = []
    for params, bucket_sizes in zip(buckets, sizes):
        start, stop = shard_bounds(sum(bucket_sizes), ranks)[rank]
        plan.append(slice_pieces(params, bucket_sizes, start, stop))
    return plan
