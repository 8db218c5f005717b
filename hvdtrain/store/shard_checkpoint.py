"""The sharded optimizer state (:mod:`.sharded`) as one whole state, and back.

A checkpoint of a sharded run holds the optimizer state an unsharded run of the same model
holds, in the same file (``Trainer.save_states``'s pickle: per parameter position, its state
arrays in the parameter's shape, and the optimizer object with its update counts and rate
schedule). So a checkpoint resumes at any world size, sharded or not, and a sharded run
resumes from an unsharded run's checkpoint: each rank cuts its pieces out of the whole.

Gathering is a collective: per bucket, per state array of its optimizer (Adam's mean and
variance: two) and per chunk of a slice, one call given every rank's part, padded to the
largest slice (a rank whose slice of a small bucket is empty sends padding, which MXNet can
allocate): an all-gather, the whole state then assembled in host memory on every rank (an
elastic commit), or, for a save, to rank 0 alone, which streams each chunk into the states
file as it arrives (:mod:`.shard_states_file`) and holds no more than the others.
"""
from __future__ import annotations

from typing import BinaryIO, Callable, Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np

from .shard_plan import Piece, shard_bounds
from .shard_states_file import ArraySpace, write_at


def leaves(state) -> List[Optional[mx.nd.NDArray]]:
    """The arrays of one parameter's state (an NDArray, None, or nested tuples and lists of
    them), in order."""
    if isinstance(state, (tuple, list)):
        return [leaf for part in state for leaf in leaves(part)]
    return [state]


def rebuilt(template, arrays) -> object:
    """`template`'s structure with its arrays taken in order from the iterator `arrays`."""
    if isinstance(template, (tuple, list)):
        return type(template)(rebuilt(part, arrays) for part in template)
    return None if template is None else next(arrays)


def gather_whole(buckets: Sequence[Sequence[int]], shapes: Sequence[tuple],
                 pieces: Sequence[Sequence[Piece]], states: Dict[int, object],
                 template: Callable[[int], object], rank: int, ranks: int,
                 allgather: Callable[[np.ndarray, str], Optional[np.ndarray]],
                 present: Callable[[np.ndarray], np.ndarray],
                 chunk: Optional[int] = None, site: str = "shard.state",
                 skeleton: Optional[Callable[[dict], BinaryIO]] = None
                 ) -> Optional[Dict[int, object]]:
    """Every rank: the whole optimizer state, {parameter position: state of its shape}, on
    the CPU, from each rank's `states` of its `pieces` (per bucket, as planned); None on a
    rank to which `allgather` gives nothing (a gather to rank 0 alone).

    Parameters
    ----------
    buckets, shapes
        Each bucket's parameter positions; every parameter's shape, by position.
    template : callable
        ``template(position)``: a state of one element of that parameter, whose structure
        and dtypes the whole state takes (the optimizer's ``create_state_multi_precision``).
    allgather : callable
        ``allgather(vector, name)``: the ranks' equal-length vectors, end to end (or None,
        on every rank but the one that gathers).
    chunk : int, optional
        Gather at most this many elements of a slice a call (default: a slice a call), so
        that a rank that does not gather holds no more than its own slice and a chunk.
    site : str
        The collectives' names begin with it (then the bucket, the state array, the chunk).
    skeleton : callable, optional
        On the rank that gathers, to stream the state into a file instead of holding it:
        ``skeleton(spaces)`` writes the file of the whole state with an
        :class:`~.shard_states_file.ArraySpace` in each array's place and returns it open;
        each chunk is written there as it arrives, and None is returned.
    present : callable
        ``present(counts)``: per parameter position, the sum over ranks (how many ranks hold
        a state of a piece of it: none before its first update).
    """
    held = np.zeros(len(shapes), dtype=np.float32)
    for bucket_pieces in pieces:
        for piece in bucket_pieces:
            held[piece.param] += piece.param in states
    held = present(held)
    whole: Dict[int, object] = {}
    arrays: Dict[int, List[mx.nd.NDArray]] = {}
    gathering = True
    out, spaces = None, {}
    if skeleton is not None:  # each array's place in the file
        spaces = {i: [ArraySpace(shapes[i], leaf.dtype) for leaf in leaves(template(i))
                      if leaf is not None] for bucket in buckets for i in bucket if held[i]}
        out = skeleton({i: rebuilt(template(i), iter(s)) for i, s in spaces.items()})
    for b, bucket in enumerate(buckets):
        sizes = [int(np.prod(shapes[i])) for i in bucket]
        bounds = shard_bounds(sum(sizes), ranks)
        width = max(1, bounds[0][1] - bounds[0][0])  # the first slice is the largest
        form = template(bucket[0])
        starts = np.cumsum([0] + sizes).tolist()
        arrays_before = 0  # the state's arrays before the k-th
        for k, kind in enumerate(leaves(form)):
            if kind is None:
                continue
            arrays_before += 1
            mine = np.zeros(width, dtype=kind.dtype)
            for piece in pieces[b]:
                state = states.get(piece.param)
                if state is not None:
                    mine[piece.offset:piece.offset + piece.size] = \
                        leaves(state)[k].asnumpy().reshape(-1)
            flat = np.empty(starts[-1], dtype=kind.dtype) if out is None else None

            def place(start, values, n=arrays_before - 1, flat=flat):
                if flat is not None:
                    flat[start:start + values.size] = values
                    return
                for i, begin, end in zip(bucket, starts, starts[1:]):
                    lo, hi = max(start, begin), min(start + values.size, end)
                    if lo < hi and held[i]:
                        write_at(out, spaces[i][n], lo - begin, values[lo - start:hi - start])

            if ranks == 1:
                flat = mine
            elif not _gathered(mine, bounds, allgather, f"{site}.{b}.{k}", chunk or width,
                               place):
                gathering = False  # a rank that only sends
                continue
            if out is not None:
                continue  # written
            offset = 0
            for i, size in zip(bucket, sizes):
                if held[i]:
                    arrays.setdefault(i, []).append(
                        mx.nd.array(flat[offset:offset + size].reshape(shapes[i]),
                                    ctx=mx.cpu(), dtype=kind.dtype))
                offset += size
        for i in bucket if gathering and out is None else []:
            if held[i]:  # a state of no arrays (SGD without momentum: None) is kept too
                whole[i] = rebuilt(template(i), iter(arrays.get(i, [])))
    if out is not None:
        out.flush()
    return whole if gathering and out is None else None


def _gathered(mine: np.ndarray, bounds, allgather, name: str, chunk: int,
              place: Callable[[int, np.ndarray], None]) -> bool:
    """One state array of a bucket from every rank's slice of it (`mine`: this rank's,
    padded to the largest), `chunk` elements of a slice a call, each rank's part of a chunk
    given to ``place(start in the bucket, values)`` as it arrives. False where `allgather`
    gives nothing (every call is made alike)."""
    received = False
    for j, start in enumerate(range(0, mine.size, chunk)):
        size = min(chunk, mine.size - start)
        ends = allgather(mine[start:start + size], f"{name}.{j}")
        if ends is None:
            continue
        received = True
        for r, (lo, hi) in enumerate(bounds):
            take = max(0, min(size, hi - lo - start))
            if take:
                place(lo + start, ends[r * size:r * size + take])
    return received


def check_shapes(whole: Dict[int, object], shapes: Sequence[Optional[tuple]]) -> None:
    """Refuse (ValueError) a whole state whose arrays do not have their parameter's shape (a
    state of another model, or of its parameters in another order): at load, on every rank,
    rather than at the first step on the rank whose slice meets it. `shapes`: every
    parameter's, by position (None, or 0 in it: not known yet, not checked)."""
    for index, state in whole.items():
        if index >= len(shapes):
            raise ValueError(f"the optimizer state names parameter {index}; the model has "
                             f"{len(shapes)}: a state of another model")
        shape = shapes[index]
        if not shape or 0 in shape:
            continue
        for leaf in leaves(state):
            if leaf is not None and tuple(leaf.shape) != tuple(shape):
                raise ValueError(
                    f"the optimizer state of parameter {index} has shape "
                    f"{tuple(leaf.shape)}, the parameter {tuple(shape)}: a state of another "
                    f"model, or of its parameters in another order")


def sliced(whole: Dict[int, object], pieces: Sequence[Sequence[Piece]],
           ctx: mx.Context) -> Dict[int, object]:
    """This rank's states of its `pieces`, cut out of `whole` (a whole state, as
    :func:`gather_whole` gives or an unsharded ``Trainer.save_states`` holds, its shapes
    checked: :func:`check_shapes`), on `ctx`."""
    mine = {}
    for bucket_pieces in pieces:
        for piece in bucket_pieces:
            state = whole.get(piece.param)
            if state is None:
                continue  # never updated when saved: created at its first update, as then
            cut = (leaf.reshape(-1)[piece.start:piece.stop].as_in_context(ctx).copy()
                   for leaf in leaves(state) if leaf is not None)
            mine[piece.param] = rebuilt(state, cut)
    return mine
