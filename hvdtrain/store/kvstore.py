"""A Horovod KVStore for MXNet 1.9.1, and the factory for every store hvdtrain can use.

MXNet 1.9.1 ships no Horovod store, so Gluon's ``Trainer`` cannot use Horovod directly.
:class:`HorovodKVStore` implements the ``KVStoreBase`` contract on top of
``horovod.mxnet`` and is registered under the name ``horovod``: after ``import hvdtrain``,
``mx.kv.create('horovod')`` and ``gluon.Trainer(params, opt, kvstore=store)`` work.
"""
from __future__ import annotations

import os
from typing import Optional

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from ..config import ConfigError
from .broadcast import broadcast_

NATIVE_STORES = ("local", "device", "dist_sync", "dist_device_sync", "dist_async")

# Set before hvd.init() unless the user set them. Open MPI busy-polls while it waits; when
# ranks share cores with compute (CPU training, or a GPU host's data loading) the polling
# steals them. Yielding took two ResNet-18 ranks on this 2-core machine from 93 to 141 img/s
# (make bench). On GPU hosts MPI carries only Horovod's coordination, so the added wake-up
# latency does not matter there either. It changes speed only, never what a program does.
# No stall or timeout variable is set here: a program that creates this store gets
# Horovod's own defaults (warn about a stalled collective, never shut down), so a rank that
# pauses for minutes (a checkpoint to slow storage, an evaluation on rank 0 alone) is slow,
# not dead. The ``hvdtrain`` command sets its own (``--stall-timeout``); a library user who
# wants Horovod to end a stalled job sets HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
# (docs/reliability.md).
HOROVOD_ENV_DEFAULTS = {
    "OMPI_MCA_mpi_yield_when_idle": "1",
}


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


class HorovodKVStore(KVStoreBase):
    """Sum-allreduce and broadcast through Horovod, behind MXNet's KVStore interface.

    Creating the store calls ``hvd.init()``; importing this module does not.
    Gradients are *summed* across workers, like MXNet's ``dist_sync``: pass the global batch
    size to ``Trainer.step`` to average them. The store never runs an optimizer, so a
    ``Trainer`` keeps ``update_on_kvstore=False`` and every worker applies the same update.

    Collective names are derived from the key and the kind of operation
    (``broadcast.<key>``, ``allreduce.<key>``), so a broadcast and a gradient reduction of the
    same parameter can never be matched with each other across ranks.

    Parameters
    ----------
    compression : {'none', 'fp16'}, default 'none'
        Send float gradients as float16 on the wire (the sum is taken in float16, as with
        Horovod's ``Compression.fp16``), through one reused buffer per key.
    timeline : str, optional
        Write Horovod's timeline (a Chrome trace of every collective's phases) to this
        file; rank 0 writes it.
    fuse_calls : bool, default True
        Let Horovod fuse separate calls that are ready in the same cycle into one buffer.
        False (``HOROVOD_DISABLE_GROUP_FUSION=1`` unless set) reduces each call alone and
        in place: the right choice when every call is already a whole flat bucket, which
        fusion would only copy into its buffer and back.
    comm : mpi4py.MPI.Comm, optional
        Run Horovod on this communicator instead of all of ``MPI_COMM_WORLD``
        (``hvd.init(comm=comm)``, which duplicates it): an MPI application, or a sweep that
        splits one allocation, trains on its own sub-communicator. Ranks, sizes and every
        collective are then relative to `comm`. Needs mpi4py built against the MPI Horovod
        uses, and a process can initialise Horovod only once.
    """

    def __init__(self, compression="none", timeline=None, fuse_calls=True, comm=None):
        import horovod.mxnet as hvd  # imported here: importing horovod loads MPI

        if compression not in ("none", "fp16"):
            raise ValueError(f"compression must be 'none' or 'fp16', got {compression!r}")
        for name, value in HOROVOD_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)  # read by hvd.init()
        if timeline:
            os.environ["HOROVOD_TIMELINE"] = timeline
        if not fuse_calls:
            os.environ.setdefault("HOROVOD_DISABLE_GROUP_FUSION", "1")
        if comm is None:
            hvd.init()
        else:
            hvd.init(comm=comm)
        self._hvd = hvd
        self._fp16_wire = compression == "fp16"
        self._wire_buffers = {}  # key -> float16 copy sent in its place

    @property
    def type(self):
        return "horovod"

    @property
    def compression(self) -> str:
        """How gradients travel: ``'fp16'`` or ``'none'`` (bookkeeping never compressed)."""
        return "fp16" if self._fp16_wire else "none"

    @property
    def _alone(self):
        # A lone worker has nothing to exchange: skipping Horovod's collectives saves their
        # cost. Read every time: an elastic job's size changes.
        return self._hvd.size() == 1

    @property
    def rank(self):
        return self._hvd.rank()

    @property
    def num_workers(self):
        return self._hvd.size()

    @property
    def local_rank(self):
        """Rank of this worker among the workers of its host."""
        return self._hvd.local_rank()

    @property
    def local_size(self):
        """Number of workers on this worker's host."""
        return self._hvd.local_size()

    def shutdown(self):
        """Stop Horovod on this rank. When every rank calls it at the same point their
        background threads stop together, and none sees a vanished peer."""
        self._hvd.shutdown()

    def broadcast(self, key, value, out, priority=0):
        """Broadcast `value` from rank 0 and write it to every array of `out`.

        Parameters
        ----------
        key : str or int
            Names the collective; must be the same on every rank.
        value : NDArray
            The array to send (rank 0) or to overwrite (other ranks).
        out : NDArray or list of NDArray
            Arrays that receive the result (`value` may be one of them).
        priority : int, optional
            Higher runs earlier in MXNet's engine.
        """
        if not self._alone:  # alone, the copies below are the whole broadcast
            # A sum, not Horovod's broadcast, which can crash (store/broadcast.py).
            broadcast_(self._hvd, value, f"broadcast.{key}", priority=priority)
        for target in _as_list(out):
            if target is not value:
                value.copyto(target)

    def pushpull(self, key, value, out=None, priority=0):
        """Sum `value` over all workers (and over its own list of device copies).

        Parameters
        ----------
        key : str, int, or list of them
            One key, or one key per entry of `value`. Several keys are reduced in a single
            grouped Horovod call.
        value : NDArray, list of NDArray, or a list of those (one per key)
            For one key, its copies on this worker's devices, which are summed first.
        out : same structure as `value`, optional
            Where the sums go, leaving `value` untouched (as MXNet's own stores do); by
            default the sums overwrite `value` in place.
        priority : int, optional
            Higher runs earlier in MXNet's engine.
        """
        self._pushpull(key, value, out, priority, compress=self._fp16_wire)

    def sum_exact(self, key, value, out=None, priority=0):
        """:meth:`pushpull`, never compressed: for the run's bookkeeping (metric sums,
        finite-loss and agreement checks, running statistics), which must be exact
        even when gradients travel as float16."""
        self._pushpull(key, value, out, priority, compress=False)

    def _pushpull(self, key, value, out, priority, compress):
        if isinstance(key, (list, tuple)):
            keys, values = list(key), list(value)
            outs = list(out) if out is not None else [None] * len(keys)
            if not len(keys) == len(values) == len(outs):
                raise ValueError("pushpull needs as many values and outs as keys")
        else:
            keys, values, outs = [key], [value], [out]

        # With `out` given the sum is taken in a copy: `value` must stay as it was.
        tensors = [self._local_sum(v, fresh=d is not None) for v, d in zip(values, outs)]
        if not self._alone:
            self._allreduce(keys, tensors, priority, compress)
        for tensor, vals, dest in zip(tensors, values, outs):
            for target in _as_list(dest if dest is not None else vals):
                if target is not tensor:
                    tensor.copyto(target)

    def _allreduce(self, keys, tensors, priority, compress):
        """Sum `tensors` over all workers in place, as float16 on the wire if `compress`."""
        sent = [self._wire_copy(key, tensor) if compress else tensor
                for key, tensor in zip(keys, tensors)]
        if len(keys) == 1:
            self._hvd.allreduce_(sent[0], op=self._hvd.Sum, name=f"allreduce.{keys[0]}",
                                 priority=priority)
        else:
            self._hvd.grouped_allreduce_(sent, op=self._hvd.Sum, priority=priority,
                                         name="allreduce." + ",".join(str(k) for k in keys))
        for tensor, data in zip(tensors, sent):
            if data is not tensor:
                mx.nd.cast(data, dtype=tensor.dtype, out=tensor)

    def _wire_copy(self, key, tensor):
        """What goes on the wire for `tensor` under fp16 compression: a float16 copy in a
        buffer kept per key (integer tensors go as they are). Fresh copies every step
        (Horovod's ``Compression.fp16``) fragmented the heap: a rank's RSS grew by about
        12 MB a step with ResNet-18."""
        if tensor.dtype not in (np.float32, np.float64):
            return tensor
        buffer = self._wire_buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.context != tensor.context:
            buffer = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=np.float16)
            self._wire_buffers[key] = buffer
        mx.nd.cast(tensor, dtype=np.float16, out=buffer)
        return buffer

    @staticmethod
    def _local_sum(value, fresh=False):
        """One array holding the sum of a key's copies on this worker's devices: the copy
        itself when there is one, unless `fresh` asks for a new array."""
        copies = _as_list(value)
        if len(copies) == 1:
            return copies[0].copy() if fresh else copies[0]
        total = copies[0].copy()
        for other in copies[1:]:
            total += other.as_in_context(total.context)
        return total

    @staticmethod
    def is_capable(capability):
        """Only capability asked for by Gluon is 'optimizer', which this store lacks."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise ValueError(f"Unknown capability: {capability}")

    def set_optimizer(self, optimizer):
        raise NotImplementedError("the horovod store does not run optimizers; "
                                  "use gluon.Trainer with update_on_kvstore=False")

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError("optimizer states live in the Trainer: "
                                  "use Trainer.save_states")

    def load_optimizer_states(self, fname):
        raise NotImplementedError("optimizer states live in the Trainer: "
                                  "use Trainer.load_states")


# KVStoreBase.register would file the class as 'horovodkvstore' (its lower-cased class
# name); users and MXNet's own docs call this store 'horovod'.
KVStoreBase.kv_registry["horovod"] = HorovodKVStore


def create_store(name: Optional[str], **options):
    """Create the store named `name`.

    Parameters
    ----------
    name : str or None
        ``'horovod'`` for :class:`HorovodKVStore`; ``'local'``, ``'device'`` or a
        ``'dist_*'`` type for MXNet's own stores; ``'none'`` or None for no store
        (single device, single worker).
    **options
        Passed to :class:`HorovodKVStore` (``compression='fp16'``, ``comm=`` an mpi4py
        communicator); MXNet's stores take none.

    Returns
    -------
    KVStoreBase or None
    """
    if name is None or name == "none":
        return None
    if name == "horovod":
        return HorovodKVStore(**options)
    if name in NATIVE_STORES:
        if options:
            raise ValueError(f"the {name} store takes no options, got "
                             f"{', '.join(sorted(options))}")
        if name.startswith("dist") and "DMLC_ROLE" not in os.environ:
            # MXNet would stop on a missing DMLC_NUM_WORKER with a C++ check and a traceback.
            raise ConfigError(f"--kvstore {name} runs under the parameter-server launcher: "
                              f"start it with hvdtrain-launch (docs/parameter-server.md), or "
                              f"use --kvstore horovod under horovodrun")
        return mx.kv.create(name)
    raise ValueError(f"unknown kvstore {name!r}; expected horovod, none or one of "
                     f"{', '.join(NATIVE_STORES)}")
