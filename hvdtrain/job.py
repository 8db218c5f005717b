"""One rank of a run of the ``hvdtrain`` command: an image classifier trained by the
:class:`~hvdtrain.estimator.Estimator`, the one engine any model trains on.

``main()`` of the ``hvdtrain`` command reduces to ``train(parse_config(argv))``; the library
API, the examples and the tests call :func:`train` the same way. What the command adds to
the Estimator is what it builds by name and in order::

    cfg -> the run folder decided (RunDir.decide) -> start weights read -> data loaded
        -> model built -> store (hvd.init) -> devices -> model initialised, start weights
        loaded -> trainer -> loaders -> Estimator(..., ClassifierProcessor).fit

so that everything a user can get wrong (flags, a checkpoint that does not fit, an output
folder holding another run, weights of another model) is refused before any data is loaded
or anything is written, and a stop signal is noted from the first seconds on. The Estimator
then restores the checkpoint, claims the folder, broadcasts, trains, and saves the model
card, ``--ema``'s average and ``model.params`` at the end.
"""
from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Optional

from mxnet import gluon

from .classify.build import build_loaders, build_trainer, initialize
from .classify.processor import ClassifierProcessor, train_metrics, val_metrics
from .config import ConfigError, TrainConfig
from .data.card import CARD_FILE, model_card, write_card
from .data.datasets import check_dataset
from .data.load import load_dataset
from .estimator.estimator import Estimator
from .estimator.setup import (Setup, check_elastic_watchdog, check_store_for_devices,
                             dist_for, start_rank)
from .loop.engine import precision
from .loop.recipe.ema import WeightAverage
from .loop.recipe.last_gamma import check_last_gamma, zero_last_gammas
from .loop.recipe.mixing import Mixing
from .loop.weights.files import WeightsFile, resolve as resolve_weights
from .loop.weights.finetune import apply_phase, set_head_lr_mult
from .loop.weights.start import load_start_weights
from .models import build_model, check_model_name
from .report.log import launch_rank, setup_logging
from .runtime.lifeline import LauncherWatch, launcher_chain
from .runtime.stop_signals import StopSignals
from .runtime.watchdog import Watchdog
from .state.run_dir import RunDir
from .store.dist import DistContext, select_devices

logger = logging.getLogger("hvdtrain")


@dataclass
class Run:
    """What a finished run leaves in this process."""

    net: object
    trainer: object
    dist: DistContext
    result: dict
    ema: Optional[WeightAverage] = None  # --ema's average of the model


def build_dist(cfg: TrainConfig, comm=None) -> DistContext:
    """Create the store (``hvd.init()`` happens here for Horovod) and read the layout.

    `comm` (an mpi4py communicator) runs Horovod on it instead of all of MPI_COMM_WORLD.
    """
    return dist_for(cfg, comm=comm)


def build_devices(cfg: TrainConfig, dist: DistContext, policy, devices=None) -> list:
    """This rank's devices (`devices`, or those the configuration names), checked against
    the precision policy and the store."""
    devices = devices or select_devices(dist.local_rank, cfg.no_cuda, cfg.gpus,
                                        cfg.gpus_per_worker)
    policy.check_devices(devices)
    check_store_for_devices(cfg.kvstore, dist, devices)
    return devices


def check_image_options(cfg: TrainConfig, data) -> None:
    """Refuse, in one line, an option that only images take on data that are not images:
    mixup and cutmix blend (N, C, H, W) batches."""
    shape = tuple(getattr(data, "image_shape", ()))
    if (cfg.mixup or cfg.cutmix) and len(shape) != 3:
        flag = "--mixup" if cfg.mixup else "--cutmix"
        raise ConfigError(f"{flag} mixes images (each sample channels x height x width); "
                          f"{data.name}'s samples have shape {shape}: drop {flag}")


def train(cfg: TrainConfig, devices=None, comm=None) -> Run:
    """Run the whole job described by `cfg` in this process (one rank of it).

    `devices` overrides the devices chosen from the configuration (a list of contexts).
    `comm`, an mpi4py communicator, is the group of processes this job runs on (default:
    every process of the launch); see ``examples/sweep_mpi.py``. From the first collective
    (``hvd.init()``) on, a :class:`Watchdog` ends this process when no rank makes progress
    for ``cfg.stall_timeout`` seconds; throughout, a :class:`LauncherWatch` asks for a stop
    when the launcher that started it is gone, as a stop signal does (:class:`StopSignals`):
    the run ends at the next step boundary with its checkpoint saved, and
    :class:`~hvdtrain.loop.run.together.Preempted` is raised.
    """
    # Until the store knows the rank, the launcher's numbering tags the lines (and keeps
    # the INFO lines of ranks other than 0 quiet).
    setup_logging(launch_rank())
    watchdog = Watchdog(cfg.stall_timeout)
    with ExitStack() as until_the_end:  # each guard entered here lasts until the run ends
        # From here a stop signal is noted, start-up included, and acted on at the first
        # step boundary after it, in every run (an elastic one too: docs/elastic.md).
        signals = until_the_end.enter_context(StopSignals(describe=watchdog.who))
        until_the_end.enter_context(LauncherWatch(
            launcher_chain(), describe=watchdog.who, on_gone=signals.request))
        check_model_name(cfg.model_name)  # what the command names, before the folder
        check_dataset(cfg.dataset, cfg.data_dir)
        if cfg.elastic and os.environ.get("HOROVOD_ELASTIC") != "1":
            raise ConfigError("--elastic runs under Horovod's elastic driver: start it with "
                              "horovodrun -np N --min-np M --host-discovery-script SCRIPT "
                              "(docs/elastic.md)")
        run_dir = RunDir.decide(cfg)
        weights = start_weights(cfg, run_dir)  # read now: a bad file is refused at once
        data = load_dataset(cfg.dataset, cfg.data_dir, cfg.image_size)
        check_image_options(cfg, data)
        run_dir.check_classes(getattr(data, "classes", None))
        card = model_card(cfg.model_name, data, cfg.dtype)
        policy = precision.Precision.of(cfg)
        policy.before_model()
        net = build_model(cfg.model_name, data.num_classes)
        if cfg.last_gamma:  # refused before any collective when the model has no such blocks
            check_last_gamma(net, cfg.model_name)
        check_elastic_watchdog(cfg)  # before hvd.init()
        until_the_end.enter_context(watchdog)
        dist = build_dist(cfg, comm)
        start_rank(cfg, dist, watchdog)
        devices = build_devices(cfg, dist, policy, devices)
        initialize(net, devices, data.image_shape, cfg.seed, dist.rank, cfg.hybridize)
        if weights is not None:  # on every rank, before rank 0's values are broadcast
            load_start_weights(net, weights, data.num_classes, card["classes"], cfg.model_name)
        if cfg.last_gamma:  # rank 0's initial values are what every rank gets
            zero_last_gammas(net, cfg.model_name)
        set_head_lr_mult(net, cfg.head_lr_mult)
        watchdog.beat("start-up (model initialised)")
        policy.prepare_model(net)
        trainer = build_trainer(net, cfg, dist, policy)
        train_feed, val_feed = build_loaders(data, cfg, dist, len(devices))
        meta = {"model": cfg.model_name, "dataset": cfg.dataset, "card": card}
        if data.streamed:  # what each output index means, for whoever uses the model later
            meta["classes"] = list(data.classes)
        setup = Setup(run_dir=run_dir, watchdog=watchdog, signals=signals, dist=dist,
                      meta=meta, final_files={CARD_FILE: lambda path: write_card(path, card)},
                      prefixes=("train", "test"), base_lr=cfg.lr,
                      describe=f"{cfg.model_name} on {data.name}",
                      epoch_begin=lambda epoch: apply_phase(net, trainer, cfg, epoch),
                      command=True)
        estimator = Estimator(
            net, gluon.loss.SoftmaxCrossEntropyLoss(), train_metrics(), val_metrics(),
            trainer=trainer, context=devices,
            batch_processor=ClassifierProcessor(cfg.label_smoothing,
                                                Mixing.of(cfg, data.num_classes),
                                                policy.input_dtype),
            config=cfg, setup=setup)
        # The command's logs are hvdtrain's own lines (each epoch's, the run's summary), not
        # MXNet's LoggingHandler's, which the Estimator adds when a run has none.
        estimator.logger.disabled = True
        estimator.fit(train_feed, val_feed, epochs=cfg.epochs)
        return Run(net, estimator.trainer, estimator.dist, _result(estimator.result),
                   estimator.ema)


def _result(figures: dict) -> dict:
    """The command's figures of a run, as its callers read them."""
    result = dict(figures)
    result.setdefault("test_acc", None)
    result["test_count"] = result.get("test_samples") or 0
    return result


def start_weights(cfg: TrainConfig, run_dir: RunDir) -> Optional[WeightsFile]:
    """The weights ``--init-from`` or ``--pretrained`` name, read; None without them, or
    when ``--resume auto`` found a checkpoint of this run to continue instead."""
    if run_dir.candidates and (cfg.init_from or cfg.pretrained):
        logger.info("--resume auto continues from %s: %s is not read",
                    run_dir.candidates[0].path,
                    "--pretrained" if cfg.pretrained else f"--init-from {cfg.init_from}")
        return None
    return resolve_weights(cfg)
