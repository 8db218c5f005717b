"""One rank of a training job, from a :class:`TrainConfig` to a trained model.

``main()`` of the ``hvdtrain`` command reduces to ``train(parse_config(argv))``; the library
API, the examples and the tests call :func:`train` the same way, so resume, outputs and
checks behave alike on every path. The data flow::

    cfg -> store = create_store(cfg.kvstore) -> DistContext -> (data, net, trainer)
        -> broadcast_parameters -> fit -> metrics / checkpoints / model.params

with the run folder in three phases around it (:class:`~hvdtrain.state.run_dir.RunDir`):
decide before the data is loaded, restore once the model and trainer exist, claim before
anything is written. The weights a new run starts from (``--init-from``, ``--pretrained``)
are read right after the decision and loaded into the initialised net on every rank, before
the broadcast.
"""
from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Optional

from .loop.engine import precision
from .state.checkpoint import Checkpointer, save_params
from .state.loss_scale import loss_scale_state
from .config import ConfigError, TrainConfig
from .data.card import CARD_FILE, model_card, write_card
from .data.datasets import check_dataset
from .data.load import load_dataset
from .store.dist import DistContext, select_devices, share_cpu_threads
from .store.kvstore import create_store
from .runtime.lifeline import LauncherWatch, launcher_chain
from .report.log import MetricsWriter, launch_rank, setup_logging
from .models import build_model, check_model_name
from .report.progress import TensorBoardWriter
from .state.run_dir import RunDir
from .loop.run.boundary import host_copy
from .loop.engine.build import broadcast_parameters, build_trainer, initialize
from .loop.recipe.ema import FINAL_EMA_PARAMS, WeightAverage
from .loop.weights.finetune import apply_phase, set_head_lr_mult
from .loop.recipe.last_gamma import check_last_gamma, zero_last_gammas
from .loop.weights.start import load_start_weights
from .loop.weights.files import WeightsFile, resolve as resolve_weights
from .loop.elastic.fit import fit_elastic
from .store.gluon_internals import skip_first_step_broadcast
from .loop.run.fit import Outputs, fit
from .loop.run.together import write_together
from .options import interval_of
from .runtime.pulse import JobPulse
from .runtime.stop_signals import StopSignals
from .runtime.watchdog import GLOO_TIMEOUT_ENV, Watchdog, gloo_timeout, horovod_stall_env
from .state.writes import atomic_write, check_writable_dir

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
    options = {}
    if cfg.horovod_timeline:
        folder = os.path.dirname(os.path.abspath(cfg.horovod_timeline))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise ConfigError(f"--horovod-timeline {cfg.horovod_timeline}: folder {folder} "
                              f"does not exist or is not writable")
    if cfg.kvstore == "horovod":
        # Buckets are flat buffers reduced in place: fusing two of them would copy both.
        options = {"compression": "fp16" if cfg.fp16_allreduce else "none",
                   "timeline": cfg.horovod_timeline, "fuse_calls": cfg.grad_bucket_mb == 0}
    if comm is not None:
        if cfg.kvstore != "horovod":
            raise ConfigError(f"a communicator needs --kvstore horovod, not {cfg.kvstore}")
        options["comm"] = comm
    return DistContext.from_store(create_store(cfg.kvstore, **options))


def build_checkpointer(cfg: TrainConfig, dist: DistContext, worker_batch: int) -> Checkpointer:
    """Rank 0's checkpoint writer (a no-op elsewhere, or without --output-dir)."""
    meta = {"config": cfg.to_dict(), "model": cfg.model_name, "dataset": cfg.dataset,
            "num_workers": dist.num_workers,
            "global_batch": cfg.global_batch(worker_batch, dist.num_workers),
            "sampler_seed": cfg.seed, "kvstore": cfg.kvstore}
    unit, every = interval_of(cfg.checkpoint_every)
    # Written in the background from a host copy, except under --elastic, whose resets
    # would run beside a write.
    saver = Checkpointer(cfg.output_dir, int(every) if unit == "epochs" else None,
                         cfg.keep_checkpoints, enabled=dist.is_root, meta=meta,
                         with_states=dist.synchronous,
                         host_copy=None if cfg.elastic else host_copy)
    saver.extra = loss_scale_state
    return saver


def build_outputs(cfg: TrainConfig, dist: DistContext, worker_batch: int) -> Outputs:
    """Metrics file, checkpoints and TensorBoard scalars, all written by rank 0 alone."""
    metrics_path = os.path.join(cfg.output_dir, "metrics.jsonl") if cfg.output_dir else None
    finals = (CARD_FILE,) + ((FINAL_EMA_PARAMS,) if cfg.ema is not None else ()) \
        + ("model.params",)
    return Outputs(MetricsWriter(metrics_path, dist.is_root),
                   build_checkpointer(cfg, dist, worker_batch),
                   TensorBoardWriter(cfg.tensorboard, dist.is_root), cfg.output_dir, finals)


def check_store_for_devices(kvstore: str, dist: DistContext, devices) -> None:
    """Refuse several devices without a store: nothing would sum their gradients, and
    each device's copy of the model would drift away from the others unnoticed."""
    if dist.store is None and len(devices) > 1:
        raise ConfigError(f"--kvstore {kvstore} cannot train on {len(devices)} devices "
                          f"({', '.join(map(str, devices))}): nothing would sum their "
                          f"gradients; use --kvstore device (or local, or horovod)")


def build_devices(cfg: TrainConfig, dist: DistContext, policy, devices=None) -> list:
    """This rank's devices (`devices`, or those the configuration names), checked against
    the precision policy and the store."""
    devices = devices or select_devices(dist.local_rank, cfg.no_cuda, cfg.gpus,
                                        cfg.gpus_per_worker)
    policy.check_devices(devices)
    check_store_for_devices(cfg.kvstore, dist, devices)
    return devices


def start_rank(cfg: TrainConfig, dist: DistContext, watchdog: Watchdog) -> None:
    """What this process does once it knows its rank, before it claims the run folder."""
    setup_logging(dist.rank)
    watchdog.set_rank(dist.rank)
    watchdog.beat("start-up (store created)")
    if not cfg.elastic:
        # The pulse's collectives run on a thread of their own and would not survive an
        # elastic reset (Horovod restarts under them); Horovod's driver watches instead.
        JobPulse.watch(watchdog, dist)  # from here, progress on any rank counts
    threads = share_cpu_threads(dist.local_size)
    if threads:
        logger.info("%d workers share this host: %d OpenMP thread(s) each", dist.local_size,
                    threads)
    if dist.is_root and cfg.tensorboard:  # before anything is written
        check_writable_dir(cfg.tensorboard, "--tensorboard")


def _save_final(net, output_dir: str, dist: DistContext, watchdog: Watchdog,
                card: dict, ema: Optional[WeightAverage] = None) -> None:
    """Rank 0 saves the model card, ``--ema``'s average and then the trained parameters
    (every rank then learns whether it could); busy meanwhile, so a save to slow storage is
    not taken for a stall. ``model.params`` comes last: a folder holding it holds a finished
    run."""
    if dist.is_root:
        with watchdog.busy("saving the final parameters"):
            atomic_write(os.path.join(output_dir, CARD_FILE), lambda p: write_card(p, card))
            if ema is not None:
                logger.info("the moving average of the parameters (--ema) saved to %s",
                            atomic_write(os.path.join(output_dir, FINAL_EMA_PARAMS), ema.save))
            logger.info("parameters saved to %s",
                        save_params(net, os.path.join(output_dir, "model.params")))


def train(cfg: TrainConfig, devices=None, comm=None) -> Run:
    """Run the whole job described by `cfg` in this process (one rank of it).

    `devices` overrides the devices chosen from the configuration (a list of contexts).
    `comm`, an mpi4py communicator, is the group of processes this job runs on (default:
    every process of the launch); see ``examples/sweep_mpi.py``.
    Everything a user can get wrong (flags, a checkpoint that does not fit, an output folder
    holding another run or in use) is refused before anything is written: the run folder
    decides before any data is loaded (:class:`RunDir`). From the first collective
    (``hvd.init()``) on, a :class:`Watchdog` ends this process when no rank makes progress
    for ``cfg.stall_timeout`` seconds; throughout, a :class:`LauncherWatch` ends it when the
    launcher that started it is gone (after saving, like a stop signal: :class:`StopSignals`).
    A stop signal (or a launcher gone) ends the run at the next step boundary with its
    checkpoint saved: :class:`~hvdtrain.loop.run.together.Preempted` is raised.
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
        run_dir.check_classes(getattr(data, "classes", None))
        card = model_card(cfg.model_name, data, cfg.dtype)
        policy = precision.Precision.of(cfg)
        policy.before_model()
        net = build_model(cfg.model_name, data.num_classes)
        if cfg.last_gamma:  # refused before any collective when the model has no such blocks
            check_last_gamma(net, cfg.model_name)
        if cfg.kvstore == "horovod":  # read by hvd.init(), so set before build_dist
            os.environ.update(horovod_stall_env(cfg.stall_timeout, os.environ, cfg.elastic))
        if cfg.elastic and cfg.stall_timeout and cfg.stall_timeout <= gloo_timeout():
            raise ConfigError(f"--stall-timeout {cfg.stall_timeout:g} must be longer than "
                              f"{GLOO_TIMEOUT_ENV}={gloo_timeout():g} under --elastic: Gloo "
                              f"must give a lost peer up (and the others roll back) before "
                              f"the watchdog ends the others")
        until_the_end.enter_context(watchdog)
        dist = build_dist(cfg, comm)
        start_rank(cfg, dist, watchdog)
        devices = build_devices(cfg, dist, policy, devices)
        worker_batch = cfg.batch_size * len(devices)
        initialize(net, devices, data.image_shape, cfg.seed, dist.rank, cfg.hybridize)
        if weights is not None:  # on every rank, before rank 0's values are broadcast
            load_start_weights(net, weights, data.num_classes, card["classes"], cfg.model_name)
        if cfg.last_gamma:  # rank 0's initial values are what every rank gets
            zero_last_gammas(net, cfg.model_name)
        set_head_lr_mult(net, cfg.head_lr_mult)
        watchdog.beat("start-up (model initialised)")
        policy.prepare_model(net)
        trainer = build_trainer(net, cfg, dist, policy)
        policy.prepare_trainer(trainer)
        if cfg.elastic:
            # Loading a checkpoint's optimizer states would make the trainer broadcast its
            # parameters first: a collective that a worker joining a running job would make
            # alone, and hang. The elastic loop's sync broadcasts them instead.
            skip_first_step_broadcast(trainer)
        state = run_dir.restore(net, trainer, devices, dist, worker_batch, data.num_train)
        # Frozen or not before the store is set up, so that its buckets are planned for the
        # epoch training starts in (a resumed run past --freeze-epochs starts unfrozen).
        apply_phase(net, trainer, cfg, state.epoch)
        watchdog.beat("start-up (trainer ready)")
        if cfg.elastic:
            # No collective before the elastic loop: a worker that joins a running job
            # meets the others first at the loop's sync (which also broadcasts rank 0's
            # parameters), and the folder is claimed again after every reset.
            until_the_end.callback(run_dir.release)
            ema = _moving_average(cfg, net, run_dir)  # the elastic sync makes rank 0's everyone's
            dist, result = fit_elastic(
                net, trainer, data, devices, dist.store, cfg, state, run_dir, watchdog,
                policy, lambda now: _outputs(cfg, now, worker_batch, data, card),
                lambda now: _finish(cfg, net, now, watchdog, card, ema), ema, signals)
            return Run(net, trainer, dist, result, ema)
        until_the_end.enter_context(run_dir.claim(dist))
        broadcast_parameters(trainer, worker_batch * dist.num_workers if dist.synchronous
                             else worker_batch)
        watchdog.beat("start-up (parameters broadcast)")
        ema = _moving_average(cfg, net, run_dir)  # of rank 0's values, on every rank
        outputs = _outputs(cfg, dist, worker_batch, data, card)
        result = fit(net, trainer, data, devices, dist, cfg, outputs, state, watchdog, policy,
                     signals=signals, ema=ema)
        _finish(cfg, net, dist, watchdog, card, ema)
        return Run(net, trainer, dist, result, ema)


def start_weights(cfg: TrainConfig, run_dir: RunDir) -> Optional[WeightsFile]:
    """The weights ``--init-from`` or ``--pretrained`` name, read; None without them, or
    when ``--resume auto`` found a checkpoint of this run to continue instead."""
    if run_dir.candidates and (cfg.init_from or cfg.pretrained):
        logger.info("--resume auto continues from %s: %s is not read",
                    run_dir.candidates[0].path,
                    "--pretrained" if cfg.pretrained else f"--init-from {cfg.init_from}")
        return None
    return resolve_weights(cfg)


def _outputs(cfg: TrainConfig, dist: DistContext, worker_batch: int, data,
             card: dict) -> Outputs:
    """The run's outputs; every checkpoint carries the model card (hvdtrain.data.card), and
    a streamed dataset's checkpoints name its classes (what a resume checks)."""
    outputs = build_outputs(cfg, dist, worker_batch)
    outputs.checkpointer.meta["card"] = card
    if data.streamed:  # what each output index means, for whoever uses the model later
        outputs.checkpointer.meta["classes"] = list(data.classes)
    return outputs


def _moving_average(cfg: TrainConfig, net, run_dir: RunDir) -> Optional[WeightAverage]:
    """``--ema``'s average: of the model as it is now, or the resumed checkpoint's."""
    ema = WeightAverage.of(cfg, net)
    if ema is not None and run_dir.resumed_from:
        ema.resume(run_dir.resumed_from)
    return ema


def _finish(cfg: TrainConfig, net, dist: DistContext, watchdog: Watchdog,
            card: dict, ema: Optional[WeightAverage] = None) -> None:
    """After the last epoch: rank 0 saves the card, the moving average and the parameters,
    and every rank learns whether it could."""
    if cfg.output_dir:
        write_together(dist, lambda: _save_final(net, cfg.output_dir, dist, watchdog, card,
                                                 ema), "the end")
