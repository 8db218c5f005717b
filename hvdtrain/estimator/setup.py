"""What an Estimator sets up for a run: its settings, its store, its devices, and the
guards that last as long as the run (the stall watchdog, the stop signals, the launcher's
lifeline). A program that does some of this itself (the ``hvdtrain`` command) hands what it
made over in a :class:`Setup`."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Set, Tuple

import mxnet as mx

from ..config import ConfigError, RunConfig
from ..options import default_of
from ..report.log import setup_logging
from ..runtime.lifeline import LauncherWatch, launcher_chain
from ..runtime.pulse import JobPulse
from ..runtime.stop_signals import StopSignals
from ..runtime.watchdog import GLOO_TIMEOUT_ENV, Watchdog, gloo_timeout, horovod_stall_env
from ..store.dist import DistContext, share_cpu_threads
from ..store.kvstore import HorovodKVStore, create_store

logger = logging.getLogger("hvdtrain")


@dataclass
class Setup:
    """What a program that sets a run up itself hands the Estimator; each field left at
    its default is done by the Estimator.

    Attributes
    ----------
    run_dir : RunDir, optional
        The output folder, decided already (``RunDir.decide``), before data was loaded.
    dist : DistContext, optional
        The layout, with its store, made already.
    watchdog, signals
        The stall watchdog and the stop signals, entered already, lasting the whole job.
    meta : dict
        More of every checkpoint's ``meta.json`` (the command's model card, class names).
    final_files : dict
        ``name -> write(path)``: files rank 0 saves beside ``model.params`` at the end
        (written before it: a folder holding ``model.params`` holds a finished run).
    prefixes : (str, str)
        How ``metrics.jsonl`` names the training and the validation split's figures.
    base_lr : float, optional
        The rate the schedule (warm-up, decay) follows; None: the optimizer's own rate,
        followed only when the configuration asks for a schedule.
    describe : str, optional
        What trains on what, for the run's first log line.
    epoch_begin : callable, optional
        ``epoch_begin(epoch)`` on every rank before each epoch's steps (the command's
        frozen and unfrozen phases).
    command : bool
        The program is the ``hvdtrain`` command: it acts on :class:`TrainConfig`'s own
        fields (the model, data and optimizer it builds), its lines name flags
        (``--resume auto``), and it turns a stop every rank agreed on into its exit status
        itself. Otherwise the Estimator refuses those fields, names its keywords
        (``resume='auto'``), and ends the process after a stop's one line with its status
        (75 for a signal, 1 for a failed write), as the command does.
    """

    run_dir: Optional[object] = None
    dist: Optional[DistContext] = None
    watchdog: Optional[Watchdog] = None
    signals: Optional[StopSignals] = None
    meta: Dict = field(default_factory=dict)
    final_files: Dict[str, Callable[[str], None]] = field(default_factory=dict)
    prefixes: Tuple[str, str] = ("train", "val")
    base_lr: Optional[float] = None
    describe: Optional[str] = None
    epoch_begin: Optional[Callable[[int], None]] = None
    command: bool = False


def run_config(config: Optional[RunConfig], options: Dict,
               command: bool = False) -> Tuple[RunConfig, Set[str]]:
    """The run's settings: `config` (a RunConfig, or the command's TrainConfig) with
    `options` (RunConfig's fields by name) on top, and the names of the fields given (a
    keyword, or a field of `config` set to anything but its default). An unknown name is
    refused in one line that lists the known ones. Unless `command` (see :class:`Setup`):
    ``epochs`` is refused (``fit``'s own argument says how long to train), and so is a
    TrainConfig whose own fields (the command's model, data and optimizer) differ from their
    defaults: the Estimator trains the objects it is given, and would ignore them."""
    known = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"the Estimator takes no option {unknown[0]!r}: its options are "
                          f"RunConfig's fields ({', '.join(sorted(known))})")
    given = set(options)
    if config is not None:
        if not isinstance(config, RunConfig):
            raise ConfigError(f"config must be an hvdtrain.RunConfig (or TrainConfig), not "
                              f"{type(config).__name__}")
        given |= {f.name for f in dataclasses.fields(config)
                  if getattr(config, f.name) != default_of(f)}
    config = config if config is not None else RunConfig()
    if not command:
        ignored = sorted(given - known, key=[f.name for f in dataclasses.fields(config)].index)
        if ignored:
            raise ConfigError(
                f"{type(config).__name__}'s {', '.join(ignored)} (the hvdtrain command's: the "
                f"model, data and optimizer it builds) would not apply to the net, data and "
                f"Trainer given to the Estimator: set {'them' if len(ignored) > 1 else 'it'} "
                f"there, and pass a RunConfig")
        if "epochs" in given:
            raise ConfigError("the Estimator takes no epochs setting: say how long to train "
                              "in fit(train_data, epochs=N) (or batches=N)")
    return (dataclasses.replace(config, **options) if options else config), given & known


def dist_for(cfg: RunConfig, store=None, comm=None) -> DistContext:
    """The run's layout: from `store` when given (checked against the settings that
    decide how it is made), else from a store made as `cfg` says (``hvd.init()`` happens
    here for Horovod; `comm`, an mpi4py communicator, runs it on a part of the launch)."""
    if store is not None:
        if isinstance(store, HorovodKVStore) and \
                (store.compression == "fp16") != cfg.fp16_allreduce:
            wire = store.compression == "fp16"
            raise ConfigError(
                f"fp16_allreduce={cfg.fp16_allreduce} but the store given sends gradients as "
                f"{'float16' if wire else 'float32'}: create it with "
                f"create_store('horovod', compression='{'fp16' if cfg.fp16_allreduce else 'none'}'), "
                f"or let the Estimator make it")
        return DistContext.from_store(store)
    if cfg.horovod_timeline:
        folder = os.path.dirname(os.path.abspath(cfg.horovod_timeline))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise ConfigError(f"--horovod-timeline {cfg.horovod_timeline}: folder {folder} "
                              f"does not exist or is not writable")
    options = {}
    if cfg.kvstore == "horovod":
        # Buckets are flat buffers reduced in place: fusing two of them would copy both.
        options = {"compression": "fp16" if cfg.fp16_allreduce else "none",
                   "timeline": cfg.horovod_timeline, "fuse_calls": cfg.grad_bucket_mb == 0}
        os.environ.update(horovod_stall_env(cfg.stall_timeout, os.environ, cfg.elastic))
    if comm is not None:
        if cfg.kvstore != "horovod":
            raise ConfigError(f"a communicator needs --kvstore horovod, not {cfg.kvstore}")
        options["comm"] = comm
    check_elastic_watchdog(cfg)
    if cfg.elastic and os.environ.get("HOROVOD_ELASTIC") != "1":
        raise ConfigError("--elastic runs under Horovod's elastic driver: start it with "
                          "horovodrun -np N --min-np M --host-discovery-script SCRIPT "
                          "(docs/elastic.md)")
    return DistContext.from_store(create_store(cfg.kvstore, **options))


def check_elastic_watchdog(cfg: RunConfig) -> None:
    """Under ``--elastic`` a lost peer is found by Gloo's timeout and the others roll back;
    a watchdog that fired first would end them instead: refused in one line."""
    if cfg.elastic and cfg.stall_timeout and cfg.stall_timeout <= gloo_timeout():
        raise ConfigError(f"--stall-timeout {cfg.stall_timeout:g} must be longer than "
                          f"{GLOO_TIMEOUT_ENV}={gloo_timeout():g} under --elastic: Gloo must "
                          f"give a lost peer up (and the others roll back) before the "
                          f"watchdog ends the others")


def default_context(dist: DistContext) -> list:
    """This rank's device when none is given: its local rank's GPU among those it sees
    (MXNet's Estimator takes GPU 0 on every rank), else the CPU."""
    visible = mx.context.num_gpus()
    return [mx.gpu(dist.local_rank % visible)] if visible else [mx.cpu()]


def check_store_for_devices(kvstore: str, dist: DistContext, devices) -> None:
    """Refuse several devices without a store: nothing would sum their gradients, and
    each device's copy of the model would drift away from the others unnoticed."""
    if dist.store is None and len(devices) > 1:
        raise ConfigError(f"--kvstore {kvstore} cannot train on {len(devices)} devices "
                          f"({', '.join(map(str, devices))}): nothing would sum their "
                          f"gradients; use --kvstore device (or local, or horovod)")


def start_rank(cfg: RunConfig, dist: DistContext, watchdog: Watchdog) -> None:
    """What a process does once it knows its rank, before it claims the run folder: its
    log lines tagged, the watchdog told, the job's pulse started (not under ``--elastic``,
    whose resets it would not survive), its share of the host's cores."""
    setup_logging(dist.rank)
    watchdog.set_rank(dist.rank)
    watchdog.beat("start-up (store created)")
    if not cfg.elastic:
        JobPulse.watch(watchdog, dist)  # from here, progress on any rank counts
    threads = share_cpu_threads(dist.local_size)
    if threads:
        logger.info("%d workers share this host: %d OpenMP thread(s) each", dist.local_size,
                    threads)


@contextlib.contextmanager
def guards(cfg: RunConfig, dist: DistContext, setup: Setup):
    """The stall watchdog, the stop signals and the launcher's lifeline for the run, unless
    `setup` brings its own (entered already); yields (watchdog, signals)."""
    with contextlib.ExitStack() as stack:
        signals = setup.signals
        watchdog = setup.watchdog
        if watchdog is None:
            watchdog = Watchdog(cfg.stall_timeout)
            signals = signals or stack.enter_context(StopSignals(describe=watchdog.who))
            stack.enter_context(LauncherWatch(launcher_chain(), describe=watchdog.who,
                                              on_gone=signals.request))
            stack.enter_context(watchdog)
            if not logging.getLogger("hvdtrain").handlers:  # the program's own, else ours
                setup_logging(dist.rank)
            watchdog.set_rank(dist.rank)
            watchdog.beat("start-up (store created)")
            if not cfg.elastic:
                JobPulse.watch(watchdog, dist)
        yield watchdog, signals
