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

import mxnet as mx
import numpy as np

ROOT_RANK = 0


def broadcast_(hvd, array: mx.nd.NDArray, name: str, priority: int = 0) -> mx.nd.NDArray:
    """Overwrite `array` on every rank with rank 0's, in place, through a sum-allreduce.

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

    Returns
    -------
    NDArray
        `array`. Like Horovod's own calls this only queues the work in MXNet's engine:
        reading `array` waits for the result.
    """
    if hvd.rank() != ROOT_RANK:
        array[:] = 0
    hvd.allreduce_(array, op=hvd.Sum, name=name, priority=priority)
    return array


def broadcast_object(hvd, obj, name: str):
    """Rank 0's `obj` on every rank: pickled, then sent as bytes by :func:`broadcast_`.

    Parameters
    ----------
    hvd : module
        ``horovod.mxnet``, initialised.
    obj : object
        What rank 0 sends; other ranks may pass anything (it is ignored).
    name : str
        Names the two collectives (the size, then the bytes); the same on every rank.

    Returns
    -------
    object
        `obj` itself on rank 0, a copy of rank 0's `obj` elsewhere. Both collectives have
        completed on this rank when it returns.
    """
    root = hvd.rank() == ROOT_RANK
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if root else b""
    size = mx.nd.array([len(payload)], dtype="int64")
    broadcast_(hvd, size, f"{name}.size")
    nbytes = int(size.asscalar())
    if root:
        data = mx.nd.array(np.frombuffer(payload, dtype=np.uint8), dtype="uint8")
    else:
        data = mx.nd.empty((nbytes,), dtype="uint8")  # broadcast_ zeroes it
    broadcast_(hvd, data, f"{name}.bytes")
    received = data.asnumpy()  # waits for the collective on every rank, rank 0's too
    return obj if root else pickle.loads(received.tobytes())
