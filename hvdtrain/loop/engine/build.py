"""The builders a job calls before :func:`~hvdtrain.loop.run.fit.fit`: the trainer, the model's
initialisation and first broadcast, and the loaders of this rank's share of the data."""
from __future__ import annotations

import logging
from typing import Optional

import mxnet as mx
from mxnet import autograd, gluon

from . import precision
from ...config import TrainConfig
from ...store.dist import DistContext
from ...store.buckets import BucketedTrainer
from ...store.powersgd import PowerSGD
from ...store.gluon_internals import set_up_store
from ...data.loader import BatchLoader
from ...data.streamed import ImageLoader
from ...data.transforms import Augment
from ...data.sampler import SplitSampler
from .batches import accumulate_gradients
from .schedule import effective_base_lr
from ..recipe.weight_decay import exempt_from_weight_decay

logger = logging.getLogger("hvdtrain")

INIT = mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)


def build_trainer(net, cfg: TrainConfig, dist: DistContext,
                  policy: Optional[precision.Precision] = None) -> gluon.Trainer:
    """A Gluon Trainer over `dist.store`, exchanging gradients in buckets of
    ``cfg.grad_bucket_mb``. The store only reduces gradients
    (``update_on_kvstore=False``): every worker applies the same update itself, and the
    optimizer state stays on the worker. ``dist_async`` is the exception: there the servers
    run the optimizer and apply each worker's gradient as it arrives. `policy` (default:
    the configuration's) adds what float16 weights need. With ``cfg.accumulate`` > 1 the
    gradients are made to accumulate (``grad_req='add'``) before the buckets are planned;
    ``cfg.no_wd`` exempts biases and normalisation layers from weight decay. With
    ``--compression powersgd`` the buckets' large gradient matrices travel as PowerSGD's
    factors (:mod:`hvdtrain.store.powersgd`), compressed once per optimizer step whatever
    ``--accumulate``."""
    policy = policy or precision.Precision.of(cfg)
    params = {"learning_rate": effective_base_lr(cfg.lr, cfg.lr_scaling, dist.num_workers),
              "wd": cfg.wd, **policy.optimizer_options()}
    if cfg.optimizer in ("sgd", "nag"):
        params["momentum"] = cfg.momentum
    # dist_async can only update on the servers (MXNet refuses anything else).
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
                               guard=policy.amp)
    return BucketedTrainer(net.collect_params(), cfg.optimizer, params, kvstore=dist.store,
                           update_on_kvstore=update_on_kvstore, bucket_mb=cfg.grad_bucket_mb,
                           compression=compression)


def initialize(net, devices, image_shape, seed: int, rank: int, hybridize: bool = True) -> None:
    """Initialise `net` on `devices` with its shapes known.

    Gluon defers shapes until the first forward pass, so a dummy forward pass forces them
    now: the parameters must exist before they can be broadcast. Seeding each rank
    differently makes a missing broadcast show up as diverging replicas.
    """
    mx.random.seed(seed + rank)
    net.initialize(INIT, ctx=devices)
    # In training mode: an inference pass lets MKL-DNN convolutions reorder weights into
    # an internal layout in place, which Horovod's broadcast cannot read.
    with autograd.train_mode():
        net(mx.nd.zeros((1,) + tuple(image_shape), ctx=devices[0]))
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)


def broadcast_parameters(trainer: gluon.Trainer, batch_size: int) -> None:
    """Make every rank hold rank 0's parameters before the first training forward pass.

    The Trainer would broadcast only inside its first ``step``, after every rank had already
    taken a gradient at its own weights, and on a parameter server that broadcast can be
    reordered with the first gradient push of the same key. So the store is set up and the
    broadcast run and waited for here.

    `batch_size` is what the first ``step`` will be given: when the servers run the
    optimizer (``dist_async``) they receive its gradient scaling now, and MXNet refuses a
    later change.
    """
    set_up_store(trainer, batch_size)
    mx.nd.waitall()


def build_loaders(data, cfg: TrainConfig, dist: DistContext, num_devices: int = 1):
    """Train loader over this rank's padded, shuffled part; test loader over its unpadded
    shard (each test sample on exactly one rank). Asynchronous workers cannot sum a sharded
    evaluation, so each scores the whole test set with the weights it holds.

    `data` is an in-memory :class:`Dataset` or a streamed
    :class:`~hvdtrain.data.streamed.ImageDataset` (decoded by :class:`ImageLoader`)."""
    train_sampler = SplitSampler(data.num_train, dist.num_workers, dist.rank, shuffle=True,
                                 seed=cfg.seed, mode=cfg.sampling)
    test_parts, test_part = (dist.num_workers, dist.rank) if dist.synchronous else (1, 0)
    test_sampler = SplitSampler(data.num_test, test_parts, test_part, pad=False)
    worker_batch = cfg.batch_size * num_devices
    if data.streamed:
        common = dict(image_size=data.image_size, data_workers=cfg.data_workers,
                      seed=cfg.seed, dtype=cfg.dtype)
        augment = Augment(cfg.min_crop_area, cfg.colour_jitter, cfg.pca_noise)
        return (ImageLoader(data.train, train_sampler, worker_batch, train=True,
                            augment=augment, **common),
                ImageLoader(data.test, test_sampler, worker_batch, train=False, **common))
    common = dict(mean=data.mean, std=data.std, data_workers=cfg.data_workers, seed=cfg.seed)
    return (BatchLoader(data.train_x, data.train_y, train_sampler, worker_batch,
                        augment=data.augment, **common),
            BatchLoader(data.test_x, data.test_y, test_sampler, worker_batch, **common))
