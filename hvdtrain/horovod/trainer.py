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

import os
import warnings
from typing import Optional

import mxnet as mx
from horovod.mxnet import Compression, DistributedOptimizer, global_process_set

from ..config import ConfigError, RunConfig
from ..loop.engine.replicas import average_running_stats, running_statistics
from ..loop.run.replica_check import ReplicaCheck
from ..loop.run.together import StoppedTogether
from ..report.log import error_line
from ..options import default_of
from ..store.buckets import BucketedTrainer
from ..store.gluon_internals import broadcast_at_first_step, is_statistic
from ..store.kvstore import HorovodKVStore
from . import session as sessions

SAMPLES_NAME = "hvdtrain.horovod.samples"
BUCKET_MB = default_of(RunConfig.__dataclass_fields__["grad_bucket_mb"])


class TrainedParams:
    """A trainer's parameters, read as the replica rooms read a net (by name)."""

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
    stores = session.__dict__.setdefault("stores", {"none": session.dist.store})
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
        The global process set only; another is refused in one line.
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
        broadcast_at_first_step(self, lambda param: not is_statistic(param))
        self._trained = TrainedParams(self._params)
        self._statistics = bool(running_statistics(self._trained))
        self.replicas = ReplicaCheck(self._trained, self, session.dist,
                                     session.replica_policy)
        session.trainers.append(self)

    def step(self, batch_size, ignore_stale_grad=False):
        """Exchange the gradients, then update with them divided by the samples every rank
        stepped with (the sum of every rank's `batch_size`)."""
        with self._session.calling(f"training step {self._steps + 1}"):
            self.allreduce_grads()
            self._exact_update(batch_size, ignore_stale_grad)

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
        count = mx.nd.array([float(batch_size)], dtype="float64")
        dist = self._session.dist
        if self._statistics and dist.num_workers > 1:
            average_running_stats(self._trained, dist, [count])
            return round(float(count.asscalar()) * dist.num_workers)
        if dist.num_workers > 1:
            dist.sum_across_workers(SAMPLES_NAME, count)
        return float(count.asscalar())

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
