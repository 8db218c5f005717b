"""What the ``hvdtrain`` command builds for an image classifier before the engine runs: its
trainer (the optimizer the flags name), the model's initialisation with its input shape
known, and the loaders of this rank's share of an in-memory or streamed image set."""
from __future__ import annotations

import logging
from typing import Optional

import mxnet as mx
from mxnet import autograd

from ..config import TrainConfig
from ..data.loader import BatchLoader
from ..data.sampler import SplitSampler
from ..data.streamed import ImageLoader
from ..data.transforms import Augment
from ..loop.engine import precision
from ..loop.engine.epoch import Loop
from ..loop.engine.guard import FiniteGuard
from ..loop.engine.schedule import effective_base_lr
from ..loop.engine.trainer import run_trainer
from ..store.buckets import BucketedTrainer
from ..store.dist import DistContext
from .processor import ClassifierProcessor, StepContext

logger = logging.getLogger("hvdtrain")

INIT = mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)


def build_trainer(net, cfg: TrainConfig, dist: DistContext,
                  policy: Optional[precision.Precision] = None) -> BucketedTrainer:
    """The command's trainer: ``--optimizer`` at ``--lr`` (for the global batch, scaled by
    ``--lr-scaling``), ``--momentum`` and ``--wd``, and what float16 weights need (`policy`,
    default the configuration's), on the run's store in gradient buckets
    (:func:`~hvdtrain.loop.engine.trainer.run_trainer`)."""
    policy = policy or precision.Precision.of(cfg)
    params = {"learning_rate": effective_base_lr(cfg.lr, cfg.lr_scaling, dist.num_workers),
              "wd": cfg.wd, **policy.optimizer_options()}
    if cfg.optimizer in ("sgd", "nag"):
        params["momentum"] = cfg.momentum
    return run_trainer(net, [net.collect_params()[name] for name in
                             sorted(net.collect_params().keys())],
                       cfg.optimizer, params, cfg, dist, policy.amp)


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


def classifier_loop(net, trainer, devices, dist: DistContext, state, mixing=None,
                    policy: Optional[precision.Precision] = None, **fields) -> Loop:
    """The engine's :class:`~hvdtrain.loop.engine.epoch.Loop` as the command's steps run
    (:class:`ClassifierProcessor`, `mixing` for ``--mixup``/``--cutmix``), for programs
    that drive :func:`~hvdtrain.loop.engine.epoch.train_epoch` themselves (benchmarks,
    tests). `state` is the TrainState those calls advance; `fields`, more of the Loop's
    (``accumulate``, ``clipper``, ``ema``, ``max_steps``...). The trainer's own rate is
    used (no schedule); the finite check runs every 10 steps."""
    policy = policy or precision.Precision()
    fields.setdefault("guard", FiniteGuard(dist, devices[0]))
    return Loop(net, trainer, devices, dist, fields.pop("lr_for_step", None),
                policy=policy, processor=ClassifierProcessor(mixing=mixing),
                context=StepContext(net, trainer, devices, dist, policy, state), **fields)
