"""Horovod's all-gather and all-to-all into arrays the caller keeps (Horovod 0.28.1).

``horovod.mxnet.allgather`` and ``alltoall`` make a new output array on every call and
wait for it. Every step that is a new, large allocation: on this 2-core host a rank's RSS
grew by about 48 MB a step with a 50M-parameter model (the heap fragments, as with the fp16
wire's fresh copies, kvstore.py), and Python waits for each bucket. Horovod's C entry points
take any output array and size it with ``NDArray::ReshapeAndAlloc``, which keeps the
storage of an array that is already large enough. So these call them as
``horovod/mxnet/mpi_ops.py`` does, with outputs of the right size made once: nothing is
allocated per step, and the calls return at once (MXNet's engine orders what reads the
outputs after the collectives, as it does for the buckets' in-place allreduce).
"""
from __future__ import annotations

import ctypes

import mxnet as mx
from mxnet.base import c_str, check_call

from ..config import ConfigError


SUPPORTED = ("0.28.",)  # the C signatures below are Horovod 0.28's


def _ops():
    import horovod  # imported here: importing horovod loads MPI
    from horovod.mxnet import mpi_ops
    if not horovod.__version__.startswith(SUPPORTED):
        raise ConfigError(f"--shard-optimizer calls Horovod {', '.join(SUPPORTED)}x's own C "
                          f"entry points; found Horovod {horovod.__version__}: install "
                          f"horovod==0.28.1 (scripts/install-deps.sh), or drop the option")
    return mpi_ops


def allgather_into(tensor: mx.nd.NDArray, out: mx.nd.NDArray, name: str,
                   priority: int = 0) -> None:
    """Concatenate every rank's `tensor` (in rank order, on the first dimension) into
    `out`."""
    ops = _ops()
    check_call(ops.MPI_MXNET_LIB_CTYPES.horovod_mxnet_allgather_async(
        ctypes.byref(tensor.handle), ctypes.byref(out.handle), c_str(name),
        ctypes.c_int(priority), ctypes.c_int(ops.global_process_set.process_set_id),
        ctypes.c_int(1)))


def alltoall_into(tensor: mx.nd.NDArray, out: mx.nd.NDArray, splits: mx.nd.NDArray,
                  received_splits: mx.nd.NDArray, name: str, priority: int = 0) -> None:
    """Send part r of `tensor` (its first dimension cut by `splits`, an int32 array on the
    CPU, the same on every rank) to rank r, and write the parts every rank sends this one
    into `out`, in rank order; `received_splits` (int32, a rank's count each, on the CPU)
    is written with their sizes."""
    ops = _ops()
    check_call(ops.MPI_MXNET_LIB_CTYPES.horovod_mxnet_alltoall_async(
        tensor.handle, out.handle, c_str(name), splits.handle, received_splits.handle,
        ctypes.c_int(priority), ctypes.c_int(ops.global_process_set.process_set_id)))
