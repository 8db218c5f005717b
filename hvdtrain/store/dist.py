"""Where this process stands in the job: rank, host-local rank, world size, devices."""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import mxnet as mx

from . import agree as agree_mod
from . import gpus as gpu_info
from .sites import FAULT_ENV
from ..config import ConfigError
from ..report.log import info_on_every_rank

logger = logging.getLogger("hvdtrain")

# Set by hvdtrain-launch for parameter-server workers, which have no host-local rank of
# their own (Horovod reports one; MXNet's dist stores do not).
LOCAL_RANK_ENV = "HVDTRAIN_LOCAL_RANK"
LOCAL_SIZE_ENV = "HVDTRAIN_LOCAL_SIZE"

# MXNet's native stores take integer keys only, and one store may not mix key types. The
# Trainer numbers parameters from 0, so reductions of named values use keys from here up,
# assigned in order of first use (which is the same on every worker).
NAMED_KEY_BASE = 1 << 30


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
    _named_keys: Dict[tuple, int] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_store(cls, store, environ=os.environ) -> "DistContext":
        """Read the job layout from `store` (None means a single worker)."""
        if store is None:
            return cls()
        local_rank = getattr(store, "local_rank", None)
        local_size = getattr(store, "local_size", None)
        if local_rank is None:
            local_rank = int(environ.get(LOCAL_RANK_ENV, 0))
            local_size = int(environ.get(LOCAL_SIZE_ENV, 1))
        return cls(rank=store.rank, local_rank=local_rank, num_workers=store.num_workers,
                   local_size=local_size, store=store)

    @property
    def synchronous(self) -> bool:
        """False for ``dist_async``, where servers apply each worker's update on arrival
        and workers never meet at a collective."""
        return self.store is None or "async" not in self.store.type

    @property
    def is_root(self) -> bool:
        """Whether this worker writes outputs and logs INFO lines."""
        return self.rank == 0

    def sum_across_workers(self, name: str, values: mx.nd.NDArray) -> mx.nd.NDArray:
        """Sum a small array over all workers, in place, and return it.

        Every worker must call this with the same `name` and shape at the same point.
        The sum is exact: it never travels compressed, whatever the store does with
        gradients (a store that compresses offers ``sum_exact`` for this).
        """
        if self.num_workers == 1:
            return values
        if not self.synchronous:
            raise RuntimeError("dist_async workers cannot reduce values with the store")
        if FAULT_ENV in os.environ:  # the fault test's switch (store/sites.py)
            agree_mod.fault_named(name, self.rank)
        if isinstance(self.store, mx.kvstore.KVStore):
            # A parameter server keeps one shape per key: the shape picks the key here, so
            # that a caller's name never carries a size (which may be a rank's own).
            named = (name, tuple(values.shape))
            key = self._named_keys.get(named)
            if key is None:
                key = self._named_keys[named] = NAMED_KEY_BASE + len(self._named_keys)
                self.store.init(key, mx.nd.zeros(values.shape, dtype=values.dtype))
            self.store.pushpull(key, values, out=values)
        elif hasattr(self.store, "sum_exact"):
            self.store.sum_exact(name, values)
        else:
            self.store.pushpull(name, values)
        return values

    def agree(self, site: str, reason=None, payload=None, key: str = ""):
        """Every rank's verdict at `site` in one collective: the payloads summed, or the
        same error on every rank where any had a `reason` (:func:`.agree.agree`)."""
        return agree_mod.agree(self, site, reason, payload, key)

    def agreement(self, site: str, size: int = 0, key: str = ""):
        """:class:`.agree.Agreement`: an exception in its block is this rank's reason."""
        return agree_mod.Agreement(self, site, size, key)


def select_devices(local_rank: int, no_cuda: bool = False,
                   gpus: Optional[Sequence[int]] = None,
                   gpus_per_worker: Optional[int] = None) -> List[mx.Context]:
    """The devices this worker computes on, logged by every rank.

    A process may see fewer GPUs than its host has: Slurm's ``--gpus-per-task`` or
    ``--gpu-bind``, a one-GPU Kubernetes pod, or a per-rank ``CUDA_VISIBLE_DEVICES``
    show each rank its own GPUs, numbered from 0. Ranks are therefore bound to
    ``local_rank % visible`` (groups of GPUs likewise), which is ``gpu(local_rank)`` when
    every GPU is visible and the one GPU there is when one is.

    Parameters
    ----------
    local_rank : int
        Rank among this host's workers.
    no_cuda : bool
        Use the CPU even when GPUs are visible.
    gpus : sequence of int, optional
        Explicit GPU ids (as this process numbers them) for a worker driving several GPUs.
    gpus_per_worker : int, optional
        A worker drives this many GPUs: group ``local_rank % (visible // n)`` of them.

    Raises
    ------
    ConfigError
        If the GPUs asked for are not visible to this process, or MXNet's CUDA build
        cannot run on one of them.
    """
    if no_cuda:
        return [mx.cpu()]
    visible = mx.context.num_gpus()
    if visible == 0:
        logger.warning("no GPU is visible to this process; training on the CPU "
                       "(pass --no-cuda to silence this)")
        return [mx.cpu()]
    seen = (f"this process sees {visible} GPU(s) (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    if gpus:
        wanted = list(gpus)
        missing = [g for g in wanted if g >= visible]
        if missing:
            raise ConfigError(f"--gpus asks for GPU {missing[0]} but {seen}; ids count "
                              f"from 0 among the visible GPUs")
    elif gpus_per_worker:
        if gpus_per_worker > visible:
            raise ConfigError(f"--gpus-per-worker {gpus_per_worker} cannot be met: {seen}")
        first = local_rank % (visible // gpus_per_worker) * gpus_per_worker
        wanted = list(range(first, first + gpus_per_worker))
    else:
        wanted = [local_rank % visible]
    # Before any GPU work: on a GPU MXNet has no kernels for, the first operator would
    # fail deep inside CUDA instead.
    gpu_info.check_supported(wanted)
    devices = [mx.gpu(g) for g in wanted]
    info_on_every_rank(logger, "local rank %d computes on %s; %s", local_rank,
                       ", ".join(map(str, devices)), seen)
    return devices


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
