"""The trainer every run steps with, for any model: a Gluon Trainer over the run's store in
zero-copy gradient buckets, and its first broadcast."""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import mxnet as mx
from mxnet import gluon

from ...config import ConfigError, RunConfig
from ...store.buckets import BucketedTrainer
from ...store.dist import DistContext
from ...store.sharded import ShardedTrainer
from ...store.gluon_internals import (asks_update_on_store, set_up_store, shape_deferred,
                                      sparse_gradient, store_of, to_default_layout,
                                      trainer_compression,
                                      trainer_optimizer, trainer_params, trainer_started,
                                      updates_on_store)
from ...store.powersgd import PowerSGD
from .weight_decay import exempt_from_weight_decay
from .batches import accumulate_gradients

logger = logging.getLogger("hvdtrain")


def run_trainer(net, params: Sequence, optimizer, optimizer_params: Optional[dict],
                cfg: RunConfig, dist: DistContext, amp: bool = False) -> BucketedTrainer:
    """A :class:`~hvdtrain.store.buckets.BucketedTrainer` of `params` (`net`'s) over
    ``dist.store``, with `optimizer` (a name and `optimizer_params`, or an Optimizer
    object). The store only reduces gradients (``update_on_kvstore=False``): every worker
    applies the same update itself, and the optimizer state stays on the worker;
    ``dist_async`` is the exception (the servers run the optimizer). With
    ``cfg.accumulate`` > 1 the gradients are made to accumulate (``grad_req='add'``) before
    the buckets are planned; ``cfg.no_wd`` exempts biases and normalisation layers from
    weight decay; with ``compression='powersgd'`` the buckets' large gradient matrices
    travel as PowerSGD's factors (:mod:`hvdtrain.store.powersgd`), guarded against AMP's
    overflows when `amp`."""
    if cfg.accumulate > 1:
        accumulate_gradients(net)
    if cfg.no_wd:
        exempt_from_weight_decay(net)
    update_on_kvstore = None if dist.store is None else not dist.synchronous
    compression = None
    if cfg.compression == "powersgd":
        rank, start = cfg.powersgd
        # Under AMP a loss-scale overflow makes the factors NaN on every rank (and AMP skips
        # that update): the guard keeps it from poisoning PowerSGD's state for good.
        compression = PowerSGD(rank, start, not cfg.powersgd_no_error_feedback, seed=cfg.seed,
                               guard=amp)
    # --shard-optimizer: the same buckets, reduce-scattered; each rank updates its slice
    # (store/sharded.py; what it is not combined with is refused by the configuration).
    kind = ShardedTrainer if cfg.shard_optimizer else BucketedTrainer
    return kind(list(params), optimizer, optimizer_params, kvstore=dist.store,
                update_on_kvstore=update_on_kvstore, bucket_mb=cfg.grad_bucket_mb,
                compression=compression)


def distributed_trainer(trainer, net, cfg: RunConfig, dist: DistContext,
                        amp: bool = False) -> gluon.Trainer:
    """`trainer` made to train on the run's store: the same parameters and optimizer object
    (its rate, momentum and update counts; a reference to the old trainer still sets and
    reads them), in gradient buckets over ``dist.store``. A :class:`BucketedTrainer` already
    on that store is kept. Refused in one line: a trainer that has stepped already (its
    store is set up), that updates on its store, or that compresses for MXNet's own stores."""
    if isinstance(trainer, BucketedTrainer) and \
            isinstance(trainer, ShardedTrainer) == cfg.shard_optimizer:
        store, _ = store_of(trainer)
        if store is dist.store or (dist.store is None and store in (None, "none")):
            return trainer
    if trainer_started(trainer):
        raise ConfigError("the Trainer has stepped already (its store is set up): hvdtrain "
                          "sets its store up for the run; give the Estimator a Trainer that "
                          "has not stepped")
    if updates_on_store(trainer) or asks_update_on_store(trainer):
        raise ConfigError("Trainer(update_on_kvstore=True): hvdtrain's workers each apply the "
                          "averaged update; drop update_on_kvstore")
    if trainer_compression(trainer):
        raise ConfigError("Trainer(compression_params=...) compresses for MXNet's own stores; "
                          "hvdtrain's wire is fp16_allreduce=True or compression='powersgd'")
    check_dense_gradients(trainer_params(trainer), dist)
    return run_trainer(net, trainer_params(trainer), trainer_optimizer(trainer), None, cfg,
                       dist, amp)


def check_dense_gradients(params: Sequence, dist: DistContext) -> None:
    """Refuse, in one line, a parameter with sparse gradients (``Embedding(sparse_grad=True)``)
    on the Horovod store: Horovod's MXNet collectives are dense, and MXNet's
    lazy update of the rows a batch touched (momentum and weight decay for those rows alone)
    is an update no dense exchange reproduces. Made with ``sparse_grad=False`` the layer
    trains as MXNet trains any dense gradient (every row updated)."""
    if getattr(dist.store, "type", None) != "horovod":  # MXNet's own stores pull rows
        return
    sparse = [param.name for param in params if sparse_gradient(param)]
    if sparse:
        raise ConfigError(
            f"parameter {sparse[0]!r}{f' (and {len(sparse) - 1} more)' if len(sparse) > 1 else ''} "
            f"has sparse gradients (Embedding(sparse_grad=True)); the ranks exchange dense "
            f"gradients only: build the layer with sparse_grad=False (its gradient then "
            f"travels whole, and every row is updated, docs/estimator.md)")


def broadcast_parameters(trainer: gluon.Trainer, batch_size: int) -> None:
    """Make every rank hold rank 0's parameters before the first training forward pass.

    The Trainer would broadcast only inside its first ``step``, after every rank had already
    taken a gradient at its own weights, and on a parameter server that broadcast can be
    reordered with the first gradient push of the same key. So the store is set up and the
    broadcast run and waited for here.

    `batch_size` is what the first ``step`` will be given: when the servers run the
    optimizer (``dist_async``) they receive its gradient scaling now, and MXNet refuses a
    later change.

    A program may have run an inference pass before (to settle shapes, or to look at its
    model): MKL-DNN then holds convolution weights in a layout of its own, which the
    broadcast cannot read ("ExecuteOperation Failed" in Horovod, MXNet's "We can't generate
    TBlob for MKLDNN data"). Every parameter is given the default layout back first
    (:mod:`.layouts`).
    """
    mx.nd.waitall()
    to_default_layout([array for param in trainer_params(trainer) if not shape_deferred(param)
                       for array in param.list_data()])
    set_up_store(trainer, batch_size)
    mx.nd.waitall()
