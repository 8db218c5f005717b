"""Broadcasts built on Horovod's allreduce, never on its broadcast.

Horovod 0.28.1's MXNet broadcast can crash the process. ``EnqueueTensorBroadcast`` queues
the operation and only then writes its name to a trace message. The name is a reference
into the parameters of the MXNet engine operation. When the broadcast completes first
(Horovod's background thread is faster than the enqueuing thread), MXNet frees those
parameters, and the trace message reads freed memory. Sometimes that is a segmentation
fault, with ``EnqueueTensorBroadcast`` and ``basic_streambuf::xsputn`` in the trace.
Allreduce and allgather are not affected: they write their trace message before they queue.

How often it happened here:

- in ``make test``, once in about 110 launched jobs (the README's four-rank CIFAR-10 job);
- in a lone process making 12,800 named broadcasts (``scripts/horovod_broadcast_race.py``),
  7 crashes in 10 runs, against 0 in 10 through :func:`broadcast_`.

``horovod.mxnet``'s ``broadcast_``, ``broadcast_parameters`` and ``broadcast_object`` all go
through that path.

So hvdtrain broadcasts with a sum. Rank 0 contributes its array, every other rank
contributes zeros, and the sum is rank 0's array, bit for bit. Adding a zero changes no
float (``-0.0`` becomes ``0.0`` on every rank alike), and integer sums are exact. A ring
allreduce moves about twice the bytes of a broadcast. hvdtrain broadcasts only at the start,
after an elastic reset and at an elastic commit, never in a step.
"""
from __future__ import annotations

import pickle
from typing import Iterator, List, Optional, Tuple

import mxnet as mx
import numpy as np

ROOT_RANK = 0
# Bytes per collective of broadcast_object: far below the 2**31 elements an NDArray of this
# MXNet build can hold, and large enough that a chunk's latency is small beside its transfer.
CHUNK_BYTES = 64 * 2 ** 20


def broadcast_(hvd, array: mx.nd.NDArray, name: str, priority: int = 0,
               root_rank: int = ROOT_RANK) -> mx.nd.NDArray:
    """Overwrite `array` on every rank with `root_rank`'s (0), in place, through a
    sum-allreduce.

    Parameters
    ----------
    hvd : module
        ``horovod.mxnet``, initialised.
    array : NDArray
        Rank 0's value to send; overwritten on the other ranks (what they held is ignored,
        NaN included).
    name : str
        Names the collective; the same on every rank.
    priority : int, optional
        Higher runs earlier in MXNet's engine.
    root_rank : int, optional
        The rank whose values every rank receives.

    Returns
    -------
    NDArray
        `array`. Like Horovod's own calls this only queues the work in MXNet's engine:
        reading `array` waits for the result.
    """
    if hvd.rank() != root_rank:
        array[:] = 0
    hvd.allreduce_(array, op=hvd.Sum, name=name, priority=priority)
    return array


def broadcast_object(hvd, obj, name: str, chunk_bytes: int = CHUNK_BYTES):
    """Rank 0's `obj` on every rank: pickled, then sent in chunks by :func:`broadcast_`.

    The object is pickled with protocol 5: contiguous NumPy arrays (and other buffers) stay
    out of the pickle and are sent from their own memory; every other rank receives each
    into one buffer of its own, which the unpickled array then uses, without a copy. The
    bytes travel as one stream of chunks of at most `chunk_bytes`, each through one
    preallocated array. So no collective exceeds `chunk_bytes` (this MXNet build has no
    64-bit tensor sizes: one array of the whole state failed above 2**31 bytes), rank 0
    holds little beyond `obj` and the pickle of what is not an array, and another rank little
    beyond what it receives.

    Parameters
    ----------
    hvd : module
        ``horovod.mxnet``, initialised.
    obj : object
        What rank 0 sends; other ranks may pass anything (it is ignored).
    name : str
        Names the collectives (``.size``, ``.sizes`` when there are arrays, then
        ``.bytes.0``, ``.bytes.1``, ...); the same on every rank.
    chunk_bytes : int, optional
        Bytes of each collective; the same on every rank.

    Returns
    -------
    object
        `obj` itself on rank 0, a copy of rank 0's `obj` elsewhere. Every collective has
        completed on this rank when it returns.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    root = hvd.rank() == ROOT_RANK
    if root:
        buffers: List[pickle.PickleBuffer] = []
        head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        # raw() never copies: NumPy hands out only contiguous arrays out of band.
        segments = [memoryview(head)] + [buffer.raw() for buffer in buffers]
        lengths = _broadcast_lengths(hvd, [len(segment) for segment in segments], name)
    else:
        lengths = _broadcast_lengths(hvd, None, name)
        segments = [memoryview(bytearray(length)) for length in lengths]
    _stream(hvd, segments, root, name, chunk_bytes)
    return obj if root else pickle.loads(segments[0], buffers=segments[1:])


def _broadcast_lengths(hvd, lengths: Optional[List[int]], name: str) -> List[int]:
    """Rank 0's segment lengths (the pickle's, then each out-of-band buffer's) everywhere:
    the pickle's length and the number of buffers first, the buffers' lengths only when
    there are any (a small object costs one collective here, as before)."""
    first = mx.nd.array([len(lengths) - 1, lengths[0]] if lengths else [0, 0], dtype="int64")
    buffers, head = (int(v) for v in broadcast_(hvd, first, f"{name}.size").asnumpy())
    if not buffers:
        return [head]
    rest = mx.nd.array(lengths[1:] if lengths else np.zeros(buffers), dtype="int64")
    return [head] + [int(v) for v in broadcast_(hvd, rest, f"{name}.sizes").asnumpy()]


def _stream(hvd, segments: List[memoryview], root: bool, name: str, chunk_bytes: int):
    """Send rank 0's `segments` into the other ranks' (same lengths), chunk by chunk.

    Every chunk has the same width (the last is padded), so one NDArray carries them all;
    each is waited for before the next is written into it."""
    lengths = [len(segment) for segment in segments]
    total = sum(lengths)
    if not total:
        return
    wire = mx.nd.empty((min(chunk_bytes, total),), dtype="uint8")
    staging = np.zeros(wire.shape, dtype=np.uint8) if root else None
    for index, pieces in enumerate(chunk_plan(lengths, wire.size)):
        if root:
            at = 0
            for segment, start, stop in pieces:
                staging[at:at + stop - start] = np.frombuffer(segments[segment], np.uint8,
                                                              stop - start, start)
                at += stop - start
            wire[:] = staging  # a synchronous copy: waits for the previous chunk's sum
        broadcast_(hvd, wire, f"{name}.bytes.{index}")
        if root:
            wire.wait_to_read()
        else:
            received = wire.asnumpy()  # waits for the sum
            at = 0
            for segment, start, stop in pieces:
                segments[segment][start:stop] = received[at:at + stop - start]
                at += stop - start


def chunk_plan(lengths: List[int], width: int) -> Iterator[List[Tuple[int, int, int]]]:
    """Cut segments of `lengths` bytes, laid end to end, into chunks of `width` bytes.

    Yields, for each chunk, its pieces ``(segment, start, stop)`` in order; the last chunk
    may be shorter. Small segments share a chunk, so a state of many small arrays costs
    few collectives."""
    pieces, room = [], width
    for segment, length in enumerate(lengths):
        start = 0
        while start < length:
            stop = start + min(room, length - start)
            pieces.append((segment, start, stop))
            room -= stop - start
            start = stop
            if not room:
                yield pieces
                pieces, room = [], width
    if pieces:
        yield pieces
