"""``hvd.DistributedTrainer`` with hvdtrain underneath: Horovod's signature, hvdtrain's step.

Horovod's trainer allreduces each gradient alone and divides by ``batch_size x size``: an
uneven last batch is not the global average, and BatchNorm's running statistics drift apart
between the ranks. This one is a :class:`~hvdtrain.store.buckets.BucketedTrainer` on the
Horovod store, and each ``step(batch_size)`` (or ``update(batch_size)`` after
``allreduce_grads()``):

1. exchanges the gradients in flat buckets (sums, never compressed unless asked);
2. waits for the engine: an inference pass's change of MKL-DNN layout, queued by the
   training forward pass, is done before the update is queued (:mod:`hvdtrain.loop.engine.layouts`);
3. in one exact collective sums every rank's ``batch_size`` and averages the running
   statistics (:mod:`hvdtrain.loop.engine.replicas`), so every rank reads the same
   statistics whenever the script looks (a validation, a save) and the update divides the
   summed gradients by the samples every rank stepped with;
4. updates, and every ``HVDTRAIN_REPLICA_CHECK_EVERY`` steps compares every array across
   the ranks (:mod:`hvdtrain.loop.run.replica_check`).
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Optional

import mxnet as mx
import numpy as np
from mxnet import autograd
from horovod.mxnet import Compression, DistributedOptimizer, global_process_set

from ..config import ConfigError, RunConfig
from ..loop.engine.replicas import average_running_stats, running_statistics
from ..loop.run.replica_check import ReplicaCheck
from ..loop.run.together import StoppedTogether
from ..report.log import error_line
from ..options import default_of
from ..store.buckets import BucketedTrainer
from ..store.gluon_internals import (after_deferred_init, broadcast_at_first_step,
                                     set_up_store_early, shape_deferred, trainer_params)
from ..store.kvstore import HorovodKVStore
from . import session as sessions

logger = logging.getLogger("hvdtrain")
BUCKET_MB = default_of(RunConfig.__dataclass_fields__["grad_bucket_mb"])


class TrainedParams:
    """A trainer's parameters, read as the replica rooms read a net (by name). It has no
    blocks: a SymbolBlock's auxiliary states (found through the net) are not told from
    frozen parameters here, and the replica check is what keeps them equal."""

    _children: dict = {}

    def __init__(self, params):
        self.params = {param.name: param for param in params}

    def collect_params(self):
        return self.params

    def _collect_params_with_prefix(self):  # what params_by_place reads of a Block
        return self.params


def _store(session, compression) -> HorovodKVStore:
    """The store for Horovod's `compression`: ``none`` or ``fp16`` (made once each)."""
    kinds = {Compression.none: "none", Compression.fp16: "fp16"}
    if compression not in kinds:
        raise ConfigError(f"compression={compression!r}: hvdtrain.horovod sends gradients "
                          f"as Compression.none or Compression.fp16")
    stores = session.stores
    stores.setdefault("none", session.dist.store)
    if kinds[compression] not in stores:
        stores[kinds[compression]] = HorovodKVStore(compression=kinds[compression],
                                                    fuse_calls=False)
    return stores[kinds[compression]]


class DistributedTrainer(BucketedTrainer):
    """``horovod.mxnet.DistributedTrainer``'s signature on hvdtrain's exchange (module).

    Parameters
    ----------
    params, optimizer, optimizer_params
        As :class:`mxnet.gluon.Trainer` (a ``DistributedOptimizer`` is unwrapped, as
        Horovod does).
    compression : Compression.none or Compression.fp16
        Gradients as float16 on the wire; the bookkeeping stays exact.
    gradient_predivide_factor : float
        Horovod splits its average into a division before the sum and one after; hvdtrain
        sums and divides once by the global sample count. Any factor is taken (the result
        is the same up to float rounding), except with ``Compression.fp16``, where the
        factor guards float16 sums from overflow and hvdtrain does not apply it: refused.
    prefix : str, optional
        Taken (Horovod names its tensors with it); the buckets' names are the trainer's.
    num_groups : int
        Taken; the buckets (``grad_bucket_mb``, 25 MiB) group the gradients instead.
    process_set
        The global process set only; another raises ConfigError.
    """

    def __init__(self, params, optimizer, optimizer_params=None,
                 compression=Compression.none,
                 gradient_predivide_factor=1.0, prefix=None,
                 num_groups=0, process_set=global_process_set):
        session = sessions.current()
        if process_set is not global_process_set and \
                getattr(process_set, "process_set_id", 0) != 0:
            raise ConfigError("hvdtrain.horovod.DistributedTrainer trains on the global "
                              "process set only: drop process_set=")
        if compression is Compression.fp16 and gradient_predivide_factor != 1.0:
            raise ConfigError("gradient_predivide_factor with Compression.fp16: hvdtrain "
                              "sums float16 gradients unscaled; drop one of them")
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer  # pylint: disable=protected-access
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer. We have unwrapped it for you.")
        self._session = session
        self._steps = 0
        store = _store(session, compression)
        super().__init__(params, optimizer, optimizer_params, kvstore=store,
                         update_on_kvstore=False, bucket_mb=BUCKET_MB)
        # The first step broadcasts rank 0's weights (a script that forgot
        # broadcast_parameters still trains one model); the statistics it averages instead.
        params = trainer_params(self)
        self._trained = TrainedParams(params)
        self._statistic_params = running_statistics(self._trained)
        averaged = {id(param) for param in self._statistic_params}
        broadcast_at_first_step(self, lambda param: id(param) not in averaged)
        # Parameters no gradient reaches that are not known statistics: frozen ones, or a
        # SymbolBlock's auxiliary states, which only the net could tell apart. Those the
        # forward pass moves between the first two steps are statistics from then on.
        self._unknown = [p for p in params if p.grad_req == "null"
                         and id(p) not in averaged
                         and np.issubdtype(np.dtype(p.dtype), np.floating)]
        self._snapshot = None
        self._float_statistics = all(np.issubdtype(np.dtype(p.dtype), np.floating)
                                     for p in self._statistic_params)
        # The buckets planned now if the shapes are known, else as soon as Gluon knows the
        # last one (in the first forward pass): a script's static graph
        # (hybridize(static_alloc=True)) then writes its first gradients into them.
        if not set_up_store_early(self):
            for param in params:
                if shape_deferred(param):
                    after_deferred_init(param, self._shape_known)
        self.replicas = ReplicaCheck(self._trained, self, session.dist,
                                     session.replica_policy)
        session.trainers.append(self)

    def _shape_known(self, _param) -> None:
        with autograd.pause():
            set_up_store_early(self)

    def step(self, batch_size, ignore_stale_grad=False):
        """Exchange the gradients, then update with them divided by the samples every rank
        stepped with (the sum of every rank's `batch_size`)."""
        with self._session.calling(f"training step {self._steps + 1}"):
            super().allreduce_grads()
            self._exact_update(batch_size, ignore_stale_grad)

    def allreduce_grads(self):
        """The exchange of :meth:`step` alone (a script clips between it and
        :meth:`update`), waited for inside hvdtrain's call: a rank whose peers never join
        it waits here, where the watchdog sees it, not in the script's next read of a
        gradient (the script's own work, which the watchdog never cuts short)."""
        with self._session.calling(f"gradient exchange {self._steps + 1}"):
            super().allreduce_grads()
            mx.nd.waitall()

    def update(self, batch_size, ignore_stale_grad=False):
        """After ``allreduce_grads()``: the update of :meth:`step`."""
        with self._session.calling(f"training step {self._steps + 1}"):
            self._exact_update(batch_size, ignore_stale_grad)

    def _exact_update(self, batch_size, ignore_stale_grad) -> None:
        samples = self.global_samples(batch_size)
        if samples > 0:  # no rank had a sample: no update (momentum and decay included)
            super().update(samples, ignore_stale_grad)
        self._steps += 1
        every = self._session.replica_every
        if every and self._steps % every == 0:
            self.check_replicas(f"step {self._steps}")

    def global_samples(self, batch_size) -> float:
        """The sum of every rank's `batch_size`, with the running statistics averaged in
        the same collective; every gradient and statistic is final when it returns."""
        mx.nd.waitall()  # the step's writes done (layouts, statistics) before the update
        dist = self._session.dist
        if dist.num_workers == 1:
            return float(batch_size)
        if self._unknown:
            self._find_moved_statistics(dist)
        if not self._float_statistics:  # an integer statistic: the engine's exact path
            count = mx.nd.array([float(batch_size)], dtype="float64")
            if self._statistic_params:
                average_running_stats(self._trained, dist, [count])
                return round(float(count.asscalar()) * dist.num_workers)
            return float(dist.sum_across_workers("horovod_step", count).asscalar())
        return _sum_count_average_statistics(self._statistic_params, batch_size, dist)

    def _find_moved_statistics(self, dist) -> None:
        """First step: copy the parameters of :attr:`_unknown`; second step: those any rank's
        forward pass moved since (one agreed vector) join the statistics averaged each
        step, in the same order on every rank."""
        if self._snapshot is None:
            self._snapshot = [p.data().copy() for p in self._unknown]
            return
        moved = mx.nd.array([float((p.data() != was).sum().asscalar() > 0)
                             for p, was in zip(self._unknown, self._snapshot)])
        moved = dist.sum_across_workers("horovod_step.moved", moved).asnumpy()
        found = [p for p, flag in zip(self._unknown, moved) if flag > 0]
        self._unknown, self._snapshot = [], None
        if found:
            self._statistic_params = sorted(self._statistic_params + found,
                                            key=lambda param: param.name)
            logger.info("%d arrays no gradient reaches moved in the forward pass (a "
                        "SymbolBlock's auxiliary states): averaged at each step from now on",
                        len(found))

    def check_replicas(self, where: str) -> Optional[object]:
        """Compare every array (weights, optimizer state, running statistics) across the
        ranks now; every rank calls it at the same point. What a difference leads to:
        ``HVDTRAIN_REPLICA_CHECK``."""
        try:
            return self.replicas.verify(where)
        except StoppedTogether as stop:  # strict: every rank says so in one line, exits 1
            error_line(stop.line)
            stop.leave()
            os._exit(stop.status)  # pylint: disable=protected-access


def _sum_count_average_statistics(params, batch_size, dist) -> float:
    """Every rank's `batch_size` summed and `params` (running statistics, floating point)
    averaged over the devices and the ranks, in one uncompressed float32 collective on the
    statistics' device; returns the sum. It runs every step, so the statistics travel in
    one buffer on their device, not one array at a time through the host as the engine's
    epoch-end average does (docs/performance.md, "hvdtrain.horovod's step"). Every rank
    computes the same float32 average, so the replicas agree; the count is exact up to
    2**24 samples."""
    device = params[0].list_ctx()[0] if params else mx.cpu()
    parts = [mx.nd.array([float(batch_size)], ctx=device, dtype="float32")]
    for param in params:
        copies = [c.astype("float32", copy=False).as_in_context(device)
                  for c in param.list_data()]
        local = copies[0] if len(copies) == 1 else mx.nd.add_n(*copies) / len(copies)
        parts.append(local.reshape(-1))
    flat = mx.nd.concat(*parts, dim=0) if len(parts) > 1 else parts[0].copy()
    # One name whatever the size (store/sites.py): every trainer of a script makes it
    # within its own step, so two are never in flight at once.
    dist.sum_across_workers("horovod_step", flat)
    flat /= dist.num_workers  # one pass: the count is read back times the ranks
    at = 1
    for param in params:
        size = int(np.prod(param.shape))
        value = flat[at:at + size].reshape(param.shape).astype(param.dtype, copy=False)
        at += size
        for copy in param.list_data():
            value.copyto(copy)
    total = round(float(flat[0].asscalar()) * dist.num_workers)
    if params:
        # Under hybridize(static_alloc=True) MXNet does not order BatchNorm's own writes
        # of its statistics after these copies: nothing may be pending when the next
        # forward pass starts.
        mx.nd.waitall()
    return float(total)
