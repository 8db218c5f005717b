"""Where this process stands in the job: rank, host-local rank, world size, devices."""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import mxnet as mx

logger = logging.getLogger("hvdtrain")


@dataclass(frozen=True)
class DistContext:
    """This worker's place in the job, read once from the store.

    Parameters
    ----------
    rank : int
        Global rank of this worker, in ``[0, num_workers)``.
    local_rank : int
        Rank among the workers on this host; picks the GPU.
    num_workers : int
        Number of workers (world size).
    local_size : int
        Number of workers on this host.
    store : KVStoreBase or None
        The store that reduces gradients and metrics; None for a lone worker.
    """

    rank: int = 0
    local_rank: int = 0
    num_workers: int = 1
    local_size: int = 1
    store: object = None

    @classmethod
    def from_store(cls, store) -> "DistContext":
        """Read the job layout from `store` (None means a single worker)."""
        if store is None:
            return cls()
        local_rank = getattr(store, "local_rank", 0)
        local_size = getattr(store, "local_size", 1)
        return cls(rank=store.rank, local_rank=local_rank, num_workers=store.num_workers,
                   local_size=local_size, store=store)

    @property
    def is_root(self) -> bool:
        """Whether this worker writes outputs and logs INFO lines."""
        return self.rank == 0

    def sum_across_workers(self, name: str, values: mx.nd.NDArray) -> mx.nd.NDArray:
        """Sum a small array over all workers, in place, and return it.

        Every worker must call this with the same `name` and shape at the same point.
        """
        if self.num_workers > 1:
            self.store.pushpull(name, values)
        return values


def select_devices(local_rank: int, no_cuda: bool = False,
                   gpus: Optional[Sequence[int]] = None) -> List[mx.Context]:
    """The devices this worker computes on.

    Parameters
    ----------
    local_rank : int
        With one GPU per worker (Horovod), the worker takes ``gpu(local_rank)``.
    no_cuda : bool
        Use the CPU even when GPUs are visible.
    gpus : sequence of int, optional
        Explicit GPU ids for a worker that drives several GPUs.
    """
    if no_cuda:
        return [mx.cpu()]
    visible = mx.context.num_gpus()
    if visible == 0:
        logger.warning("no GPU is visible to this process; training on the CPU "
                       "(pass --no-cuda to silence this)")
        return [mx.cpu()]
    wanted = list(gpus) if gpus else [local_rank]
    missing = [g for g in wanted if g >= visible]
    if missing:
        raise ValueError(f"GPU {missing[0]} was asked for but only {visible} are visible "
                         f"on this host (local rank {local_rank})")
    return [mx.gpu(g) for g in wanted]


def share_cpu_threads(local_size: int, environ=os.environ) -> Optional[int]:
    """Give this process its share of the host's cores for MXNet's OpenMP operators.

    With several workers on one host each would otherwise start one OpenMP thread per
    core, and the workers would fight over the cores. Nothing is changed when the user set
    ``OMP_NUM_THREADS`` (or there is one worker on the host).

    Returns
    -------
    int or None
        The thread count set, or None if left alone.
    """
    if "OMP_NUM_THREADS" in environ or local_size <= 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    threads = max(1, cores // local_size)
    mx.base.check_call(mx.base._LIB.MXSetNumOMPThreads(ctypes.c_int(threads)))
    return threads
