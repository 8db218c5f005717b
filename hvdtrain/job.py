"""One rank of a training job, from a :class:`TrainConfig` to a trained model.

``main()`` of the ``hvdtrain`` command reduces to ``train(parse_config(argv))``; the library
API, the examples and the tests call :func:`train` the same way, so resume, outputs and
checks behave alike on every path. The data flow::

    cfg -> store = create_store(cfg.kvstore) -> DistContext -> (data, net, trainer)
        -> resume_state -> broadcast_parameters -> fit -> metrics / checkpoints / model.params
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from .loop import precision
from .state.checkpoint import Checkpointer, read_meta, save_params
from .state.loss_scale import loss_scale_state
from .config import ConfigError, TrainConfig
from .data.datasets import load_dataset
from .store.dist import DistContext, select_devices, share_cpu_threads
from .store.kvstore import create_store
from .runtime.lifeline import LauncherWatch, launcher_chain
from .report.log import MetricsWriter, setup_logging
from .models import build_model
from .state.outdir import claim, refuse_fresh_run, refuse_if_in_use
from .report.progress import TensorBoardWriter
from .state.resume import check_compatible, resume_state
from .state.resume_from import loadable, resolve_resume
from .state.train_state import TrainState
from .loop.fit import Outputs, broadcast_parameters, build_trainer, fit, initialize
from .runtime.watchdog import Watchdog, horovod_stall_env
from .state.writes import check_writable_dir

logger = logging.getLogger("hvdtrain")


@dataclass
class Run:
    """What a finished run leaves in this process."""

    net: object
    trainer: object
    dist: DistContext
    result: dict


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
            "num_workers": dist.num_workers, "global_batch": worker_batch * dist.num_workers,
            "sampler_seed": cfg.seed, "kvstore": cfg.kvstore}
    saver = Checkpointer(cfg.output_dir, cfg.checkpoint_every, cfg.keep_checkpoints,
                         enabled=dist.is_root, meta=meta, with_states=dist.synchronous)
    saver.extra = loss_scale_state
    return saver


def build_outputs(cfg: TrainConfig, dist: DistContext, worker_batch: int) -> Outputs:
    """Metrics file, checkpoints and TensorBoard scalars, all written by rank 0 alone."""
    metrics_path = os.path.join(cfg.output_dir, "metrics.jsonl") if cfg.output_dir else None
    return Outputs(MetricsWriter(metrics_path, dist.is_root),
                   build_checkpointer(cfg, dist, worker_batch),
                   TensorBoardWriter(cfg.tensorboard, dist.is_root), cfg.output_dir)


def check_store_for_devices(kvstore: str, dist: DistContext, devices) -> None:
    """Refuse several devices without a store: nothing would sum their gradients, and
    each device's copy of the model would drift away from the others unnoticed."""
    if dist.store is None and len(devices) > 1:
        raise ConfigError(f"--kvstore {kvstore} cannot train on {len(devices)} devices "
                          f"({', '.join(map(str, devices))}): nothing would sum their "
                          f"gradients; use --kvstore device (or local, or horovod)")


def train(cfg: TrainConfig, devices=None, comm=None) -> Run:
    """Run the whole job described by `cfg` in this process (one rank of it).

    `devices` overrides the devices chosen from the configuration (a list of contexts).
    `comm`, an mpi4py communicator, is the group of processes this job runs on (default:
    every process of the launch); see ``examples/sweep_mpi.py``.
    Everything a user can get wrong (flags, a checkpoint that does not fit, an output folder
    holding another run or in use) is refused before anything is written. From the first
    collective (``hvd.init()``) on, a :class:`Watchdog` ends this process when no step
    completes for ``cfg.stall_timeout`` seconds; throughout, a :class:`LauncherWatch` ends it
    when the launcher that started it is gone.
    """
    setup_logging(rank=0)
    watchdog = Watchdog(cfg.stall_timeout)
    with LauncherWatch(launcher_chain(), describe=watchdog.who):
        refuse_if_in_use(cfg.output_dir)
        candidates = loadable(resolve_resume(cfg.resume, cfg.output_dir))
        if candidates:
            check_compatible(candidates[0], read_meta(candidates[0]), cfg)
        data = load_dataset(cfg.dataset, cfg.data_dir, cfg.image_size)
        policy = precision.Precision.of(cfg)
        policy.before_model()
        net = build_model(cfg.model_name, data.num_classes)
        if not cfg.resume:
            refuse_fresh_run(cfg.output_dir)
        if cfg.kvstore == "horovod":  # read by hvd.init(), so set before build_dist
            os.environ.update(horovod_stall_env(cfg.stall_timeout, os.environ))
        with watchdog:
            return _train(cfg, devices, candidates, data, net, policy, watchdog, comm)


def _train(cfg: TrainConfig, devices, candidates, data, net, policy, watchdog: Watchdog,
           comm=None) -> Run:
    dist = build_dist(cfg, comm)
    setup_logging(dist.rank)
    watchdog.set_rank(dist.rank)
    threads = share_cpu_threads(dist.local_size)
    if threads:
        logger.info("%d workers share this host: %d OpenMP thread(s) each", dist.local_size,
                    threads)
    if dist.is_root and cfg.tensorboard:  # before anything is written
        check_writable_dir(cfg.tensorboard, "--tensorboard")
    lock = claim(cfg.output_dir, dist)  # checks --output-dir is writable first
    try:
        return _run(cfg, data, net, policy, dist, devices, candidates, watchdog)
    finally:
        if lock is not None:
            lock.release()


def _run(cfg: TrainConfig, data, net, policy, dist: DistContext, devices, candidates,
         watchdog: Watchdog) -> Run:
    devices = devices or select_devices(dist.local_rank, cfg.no_cuda, cfg.gpus,
                                        cfg.gpus_per_worker)
    policy.check_devices(devices)
    check_store_for_devices(cfg.kvstore, dist, devices)
    worker_batch = cfg.batch_size * len(devices)
    initialize(net, devices, data.image_shape, cfg.seed, dist.rank, cfg.hybridize)
    policy.prepare_model(net)
    trainer = build_trainer(net, cfg, dist, policy)
    policy.prepare_trainer(trainer)
    state = resume_state(candidates, net, trainer, devices, dist, cfg, worker_batch,
                         data.num_train) if cfg.resume else TrainState()
    broadcast_parameters(trainer, worker_batch * dist.num_workers if dist.synchronous
                         else worker_batch)
    watchdog.beat("start-up (parameters broadcast)")
    outputs = build_outputs(cfg, dist, worker_batch)
    if data.streamed:  # what each output index means, for whoever uses the model later
        outputs.checkpointer.meta["classes"] = list(data.classes)
    result = fit(net, trainer, data, devices, dist, cfg, outputs, state, watchdog, policy)
    if cfg.output_dir and dist.is_root:
        logger.info("parameters saved to %s",
                    save_params(net, os.path.join(cfg.output_dir, "model.params")))
    return Run(net, trainer, dist, result)
