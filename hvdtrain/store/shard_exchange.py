"""One gradient bucket's exchange under the sharded optimizer state (:mod:`.sharded`), in
chunks: the temporary buffers are bounded by a chunk, whatever the largest parameter.

Each rank's slice of a bucket (:mod:`.shard_plan`) is cut into the same number K of
balanced parts on every rank (K: the largest slice over a chunk's share of a rank, so that a
chunk, every rank's k-th part, is at most ``chunk_mb`` MiB). Chunk by chunk:

- *reduce-scatter*: the parts of the bucket's gradient for each rank are copied (or cast, on
  the float16 wire) end to end into a send buffer; one Horovod all-to-all sends rank r its
  part r; the parts received are summed in rank order into this rank's own part of the
  bucket's gradient buffer (the sum stays there for the update);
- *all-gather*, after the update (the caller copies the updated weights of its slice into
  that same place): every rank's part gathered into a buffer, then copied into the weights.

Elementwise this is the unchunked exchange: the same sums in the same order, the same
update, so the weights are the same, bit for bit. A bucket of one chunk is sent from the
bucket itself (no copy), and a bucket of one chunk and one parameter gathers straight into
its weight. After a step, a bucket's gradient buffer holds no gradient: its own slice holds
the updated weights that were sent.

The buffers are made once a plan and shared by every bucket (MXNet's engine orders each
reuse after the last read: views of one array share its engine variable): per dtype, a send
buffer (also the all-gather's) and a receive buffer, each at most ``chunk_mb`` MiB; the
float16 wire (``--fp16-allreduce``) makes the send and receive buffers float16 and adds a
float16 sum of one part and a float32 gather buffer. A collective's name is the bucket's tag
and the chunk's position, the same on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from .collectives_into import allgather_into, alltoall_into
from .shard_plan import shard_bounds

CHUNK_MB = 4.0  # the default bound of each exchange buffer (ShardedTrainer's chunk_mb)
HALF = np.dtype(np.float16)


def chunk_bounds(bounds: Sequence[Tuple[int, int]],
                 per_rank: int) -> List[List[Tuple[int, int]]]:
    """Per chunk, each rank's ``[start, stop)`` in the bucket: every rank's slice (`bounds`,
    none empty) cut into the same number of balanced parts, none over `per_rank` elements
    (unless a slice has fewer elements than that number: then one element each)."""
    sizes = [stop - start for start, stop in bounds]
    count = max(1, min(-(-max(sizes) // max(1, per_rank)), min(sizes)))
    cuts = [shard_bounds(size, count) for size in sizes]
    return [[(start + cut[k][0], start + cut[k][1]) for (start, _), cut in zip(bounds, cuts)]
            for k in range(count)]


@dataclass
class Chunk:
    """One chunk of one bucket: the views its exchange reads and writes, made once a plan
    (Horovod's queued calls hold their handles)."""

    sent: mx.nd.NDArray  # what the all-to-all sends: the bucket, or the send buffer's start
    copies: List[tuple]  # (the bucket's part for a rank, its place in `sent`): before a send
    splits: mx.nd.NDArray  # int32 on the CPU: each rank's part's size, the same everywhere
    received_splits: mx.nd.NDArray
    received: mx.nd.NDArray  # every rank's part of this rank's, end to end
    parts: List[mx.nd.NDArray]  # `received`, rank by rank
    summed: mx.nd.NDArray  # where they are summed: `own`, or a float16 buffer
    own: mx.nd.NDArray  # this rank's part of the bucket's gradient buffer
    gathered: mx.nd.NDArray  # where every rank's `own` is gathered
    unpacked: List[tuple] = field(default_factory=list)  # (part of `gathered`, of a weight)


class BucketExchange:
    """The chunked reduce-scatter and all-gather of one bucket (see the module)."""

    def __init__(self, chunks: List[Chunk], own: mx.nd.NDArray, tag: str, priority: int,
                 half: bool):
        self.chunks, self.own, self.tag, self.priority = chunks, own, tag, priority
        self.half = half

    def scatter(self) -> mx.nd.NDArray:
        """Queue the reduce-scatter; returns this rank's slice of the bucket's gradient
        buffer, which will hold its sum over the ranks."""
        for k, chunk in enumerate(self.chunks):
            for part, place in chunk.copies:
                if self.half:
                    mx.nd.cast(part, dtype=np.float16, out=place)
                else:
                    part.copyto(place)
            alltoall_into(chunk.sent, chunk.received, chunk.splits, chunk.received_splits,
                          f"shard.alltoall.{self.tag}.{k}", priority=self.priority)
            if len(chunk.parts) == 2:
                mx.nd.elemwise_add(chunk.parts[0], chunk.parts[1], out=chunk.summed)
            else:
                mx.nd.add_n(*chunk.parts, out=chunk.summed)
            if self.half:
                mx.nd.cast(chunk.summed, dtype=np.float32, out=chunk.own)
        return self.own

    def gather(self) -> None:
        """Queue the all-gather of every rank's slice (this rank's: :attr:`own`, holding its
        updated weights) into the bucket's weights."""
        for k, chunk in enumerate(self.chunks):
            allgather_into(chunk.own, chunk.gathered, f"shard.allgather.{self.tag}.{k}",
                           priority=self.priority)
            for part, weight in chunk.unpacked:
                part.copyto(weight)


def plan_exchanges(flats: Sequence[mx.nd.NDArray],
                   weights: Sequence[Sequence[mx.nd.NDArray]], rank: int, ranks: int,
                   chunk_bytes: float, half: bool, tags: Sequence[str],
                   priorities: Sequence[int]) -> Tuple[List[Optional[BucketExchange]], list]:
    """Each bucket's exchange (None for a bucket of fewer elements than ranks: some rank's
    slice of it is empty, which MXNet cannot allocate; Horovod's own calls take those), and
    the buffers they share, made here. `flats`: the buckets' gradient buffers; `weights`:
    each bucket's parameters' arrays, in the bucket's order; `half`: float32 buckets go as
    float16. Also returns the buffers they share."""
    layouts, need = [], {}

    def grow(role, dtype, size):
        need[role, dtype] = max(need.get((role, dtype), 1), size)

    for flat, bucket in zip(flats, weights):
        if flat.size < ranks:
            layouts.append(None)
            continue
        dtype = np.dtype(flat.dtype)
        wire = HALF if half and dtype == np.float32 else dtype
        per_rank = max(1, int(chunk_bytes // dtype.itemsize) // ranks)
        chunks = chunk_bounds(shard_bounds(flat.size, ranks), per_rank)
        for parts in chunks:
            sizes = [stop - start for start, stop in parts]
            if len(chunks) > 1 or wire != dtype:
                grow("send", wire, sum(sizes))
            grow("received", wire, ranks * sizes[rank])
            if wire != dtype:
                grow("sum", wire, sizes[rank])
            if len(chunks) > 1 or len(bucket) > 1:
                grow("send" if wire == dtype else "gather", dtype, sum(sizes))
        layouts.append((dtype, wire, chunks))
    ctx = flats[0].context if flats else mx.cpu()
    buffers = {key: mx.nd.zeros(size, ctx=ctx, dtype=key[1]) for key, size in need.items()}
    exchanges = []
    for flat, bucket, layout, tag, priority in zip(flats, weights, layouts, tags, priorities):
        if layout is None:
            exchanges.append(None)
            continue
        dtype, wire, chunks = layout
        made = [_chunk(flat, bucket, parts, rank, buffers, dtype, wire, len(chunks) == 1)
                for parts in chunks]
        start, stop = shard_bounds(flat.size, ranks)[rank]
        exchanges.append(BucketExchange(made, flat[start:stop], tag, priority, wire != dtype))
    mx.nd.waitall()  # allocated before Horovod's thread sizes them
    return exchanges, list(buffers.values())


def _chunk(flat, bucket, parts, rank, buffers: Dict[tuple, mx.nd.NDArray], dtype, wire,
           alone: bool) -> Chunk:
    """The views of one chunk (`parts`: each rank's ``[start, stop)`` in the bucket);
    `alone`: the bucket's only chunk."""
    sizes = [stop - start for start, stop in parts]
    ends = np.cumsum([0] + sizes).tolist()
    mine = sizes[rank]
    own = flat[parts[rank][0]:parts[rank][1]]
    if alone and wire == dtype:
        sent, copies = flat, []
    else:
        sent = buffers["send", wire][:ends[-1]]
        copies = [(flat[start:stop], sent[ends[r]:ends[r + 1]])
                  for r, (start, stop) in enumerate(parts)]
    received = buffers["received", wire][:len(parts) * mine]
    if alone and len(bucket) == 1:
        gathered, unpacked = bucket[0].reshape(-1), []
    else:
        gathered = buffers["send" if wire == dtype else "gather", dtype][:ends[-1]]
        unpacked = _unpacked(gathered, bucket, parts, ends)
    return Chunk(sent=sent, copies=copies,
                 splits=mx.nd.array(sizes, ctx=mx.cpu(), dtype=np.int32),
                 received_splits=mx.nd.zeros(len(parts), ctx=mx.cpu(), dtype=np.int32),
                 received=received,
                 parts=[received[r * mine:(r + 1) * mine] for r in range(len(parts))],
                 summed=own if wire == dtype else buffers["sum", wire][:mine],
                 own=own, gathered=gathered, unpacked=unpacked)


def _unpacked(gathered, bucket, parts, ends) -> List[tuple]:
    """(part of `gathered`, part of a weight, flat) pairs: every rank's part of the chunk
    into the parameters it covers (a part may span several, or cover a piece of one)."""
    pairs, begin = [], 0
    for weight in bucket:
        end = begin + weight.size
        flat = weight.reshape(-1)
        for r, (start, stop) in enumerate(parts):
            lo, hi = max(begin, start), min(end, stop)
            if lo < hi:
                at = ends[r] + lo - start
                pairs.append((gathered[at:at + hi - lo], flat[lo - begin:hi - begin]))
        begin = end
    return pairs
