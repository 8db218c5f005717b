""":func:`fit`: a run's epochs of the step engine, for any model, and what each epoch's end
decides (:mod:`.decisions`): evaluate, save, stop.

It sees a Gluon ``Trainer``, a :class:`DistContext`, a batch processor and the Estimator's
hooks (its handlers, its metrics, its evaluation), never a backend or a model's kind; what
it is handed is made by the :class:`~hvdtrain.estimator.Estimator`.
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ...config import RunConfig
from ...report.progress import summary_lines
from ...runtime.stop_signals import StopSignals
from ...runtime.watchdog import Watchdog
from ...state.train_state import TrainState
from ...store.dist import DistContext
from ..engine import precision
from ..engine.epoch import BatchHooks, EpochStats, Loop, train_epoch
from ..engine.guard import FiniteGuard
from ..engine.layouts import InferenceLayouts
from ..engine.metrics import MetricBook, record_name
from ..engine.replicas import average_running_stats
from ..engine.schedule import lr_at
from ..recipe.parts import Recipe, log_suffix
from .boundary import Boundary
from .decisions import after_steps
from .outputs import Outputs, checkpoint, count_skipped, finish_writing, write_epoch
from .replica_check import ReplicaCheck
from .together import write_together

logger = logging.getLogger("hvdtrain")


class RunHooks:
    """What a run asks of the code around it (the Estimator): its handlers at each point,
    its batch processor, and its evaluation. The defaults do nothing."""

    processor = None  # fit_batch, evaluate_batch, batch_samples; given these hooks
    batch_hooks = BatchHooks()
    val_feed = None  # the validation split's loader (its unusable samples are counted)

    def train_begin(self) -> None:
        pass

    def epochs_after_begin(self, epochs: int, state: TrainState) -> int:
        """The epochs the run trains to, once the handlers have begun (a handler may have
        loaded a checkpoint of its own)."""
        return epochs

    def epoch_begin(self) -> None:
        pass

    def epoch_end(self) -> bool:
        """The epoch's handlers (its evaluation among them); True asks to end training."""
        return False

    def validation(self, evaluated: bool) -> Dict[str, Optional[float]]:
        """The record's validation fields of this epoch (None each when not evaluated)."""
        return {}

    def average_validation(self) -> Dict[str, Optional[float]]:
        """The validation fields of ``ema``'s average, evaluated with this epoch's."""
        return {}

    def epoch_figures(self, epoch: int) -> dict:
        """More fields of the epoch's record (the batch processor's)."""
        return {}

    def train_end(self) -> None:
        pass


@dataclass
class RunParts:
    """Everything a run's epochs use."""

    net: object
    trainer: object
    devices: list
    dist: DistContext
    cfg: RunConfig
    train_feed: object
    hooks: RunHooks
    train_book: MetricBook
    outputs: Outputs = field(default_factory=Outputs)
    state: TrainState = field(default_factory=TrainState)
    watchdog: Optional[Watchdog] = None
    policy: precision.Precision = precision.Precision()
    signals: Optional[StopSignals] = None
    ema: Optional[object] = None
    # Elastic training's hook: commit(state, point) (loop/elastic/fit.py).
    commit: Optional[Callable[[TrainState, str], None]] = None
    base_lr: Optional[float] = None  # the schedule's rate; None leaves the trainer's alone
    replicas: Optional[ReplicaCheck] = None  # compares every rank's arrays at saves
    prefixes: Tuple[str, str] = ("train", "val")  # the record's names of the two splits
    batch_axis: int = 0
    describe: str = "the model"  # who trains on what, for the first log line


def fit(run: RunParts) -> dict:
    """Train from ``run.state`` to ``run.cfg.epochs`` epochs (or ``max_steps``), evaluating
    after each and writing ``run.outputs``; return the final figures. Every completed step
    and evaluation batch beats the watchdog, and rank 0 is busy for it while it writes a
    checkpoint. ``run.commit(state, point)`` is elastic training's hook: `point` is ``"step"``
    after every step but an epoch's last, ``"epoch done"`` once an epoch is trained and
    evaluated, before its outputs are written, ``"before save"`` before a save inside an
    epoch, and ``"epoch written"`` after an epoch's outputs. ``run.signals`` notes this
    rank's stop requests: when any rank has one, every rank stops at the same step boundary,
    the checkpoint is saved, and :class:`~hvdtrain.loop.run.together.Preempted` is raised
    (loop/run/boundary.py)."""
    cfg, state, outputs, dist, hooks = run.cfg, run.state, run.outputs, run.dist, run.hooks
    feed = run.train_feed
    # The last step of an epoch takes the micro-batches left when they do not divide by
    # accumulate (loop/engine/epoch.py).
    steps_per_epoch = -(-len(feed) // cfg.accumulate)
    if cfg.accumulate > len(feed):
        logger.warning("--accumulate %d is more than the %d micro-batches of an epoch here: "
                       "each epoch is one step over %d micro-batches", cfg.accumulate,
                       len(feed), len(feed))
    if cfg.warmup_epochs and cfg.warmup_epochs >= cfg.epochs:  # e.g. a recipe line's 5 of 5
        logger.warning("--warmup-epochs %g covers the whole run of %d epochs (--epochs): the "
                       "learning rate only climbs to its peak and never follows --lr-schedule "
                       "%s; give --epochs more than the warm-up", cfg.warmup_epochs,
                       cfg.epochs, cfg.lr_schedule)
    lr_for_step = None
    if run.base_lr is not None:
        def lr_for_step(step):
            return lr_at(step, steps_per_epoch, run.base_lr, cfg.warmup_epochs,
                         cfg.lr_decay_epochs, cfg.lr_decay_factor, cfg.lr_schedule,
                         cfg.epochs * steps_per_epoch)
    recipe = Recipe.of(cfg, run.net, dist, steps_per_epoch, run.ema)
    recipe.attach(outputs.checkpointer)
    show_progress = logger.isEnabledFor(logging.INFO) and (
        cfg.progress if cfg.progress is not None else sys.stderr.isatty())
    loop = Loop(run.net, run.trainer, run.devices, dist, lr_for_step,
                FiniteGuard(dist, run.devices[0], cfg.finite_check_every), steps_per_epoch,
                cfg.max_steps, cfg.log_interval, show_progress, run.policy, run.watchdog,
                cfg.accumulate, cfg.max_bad_samples, _split_size(feed), run.commit,
                clipper=recipe.clipper, ema=recipe.ema, processor=hooks.processor,
                context=hooks, batch_axis=run.batch_axis, hooks=hooks.batch_hooks,
                layouts=InferenceLayouts([run.net, getattr(hooks, "val_net", None)],
                                         run.net.collect_params().values()),
                seed=cfg.seed)
    # Saves and stops voted at step boundaries, in every run: an elastic one too, which
    # commits to memory before each save (a peer that times out waiting for it rolls back
    # to there).
    boundary = Boundary(
        run.net, run.trainer, dist, outputs.checkpointer, cfg.checkpoint_every, run.signals,
        loop.guard, ema=recipe.ema,
        before_save=None if run.commit is None else lambda now: run.commit(now, "before save"),
        replicas=run.replicas)
    loop.boundary = boundary
    worker_batch = feed.batch_size
    store_words = cfg.kvstore + (", optimizer state sharded over the ranks"
                                 if cfg.shard_optimizer else "")
    logger.info("training %s: %d worker(s) x %d device(s) x batch %d%s = global batch %d, "
                "%d steps/epoch, %s", run.describe, dist.num_workers,
                len(run.devices), cfg.batch_size if worker_batch == cfg.batch_size *
                len(run.devices) else worker_batch,
                f" x {cfg.accumulate} micro-batches" if cfg.accumulate > 1 else "",
                cfg.global_batch(worker_batch, dist.num_workers), steps_per_epoch,
                f"lr {run.base_lr:g} for the global batch (scaling: {cfg.lr_scaling}, store: "
                f"{store_words})" if run.base_lr is not None else
                f"the optimizer's own learning rate (store: {store_words})")
    # Rank 0 writes; every rank learns whether it could (write_together), so a full disk
    # stops all of them at the same point instead of leaving them inside a collective.
    write_together(dist, lambda: outputs.metrics.write(
        "start", config=cfg.to_dict(), num_workers=dist.num_workers,
        steps_per_epoch=steps_per_epoch, devices=[str(d) for d in run.devices],
        start_epoch=state.epoch, start_step=state.step,
        start_epoch_samples=state.epoch_samples), "the start")
    hooks.train_begin()
    epochs_in_all = hooks.epochs_after_begin(cfg.epochs, state)
    run_start = time.perf_counter()
    records: List[dict] = []
    stopped, last_record = None, None
    try:
        while state.epoch < epochs_in_all:
            if cfg.max_steps is not None and state.step >= cfg.max_steps:
                break
            epoch = state.epoch
            hooks.epoch_begin()
            feed.sampler.set_epoch(epoch, state.epoch_samples)
            stats = train_epoch(loop, feed, state)
            # Training stops here until the next epoch: what is evaluated now, checkpointed
            # below and saved at the end is one model, the same on every rank and device.
            average_running_stats(run.net, dist, recipe.statistics())
            if run.replicas is not None:  # before anything is evaluated or saved
                run.replicas.verify(f"the end of epoch {epoch + 1} (step {state.step})",
                                     state=state)
            run.train_book.reduce(dist)
            last = state.epoch + 1 >= epochs_in_all or (
                cfg.max_steps is not None and state.step >= cfg.max_steps)
            plan = after_steps(bool(boundary.stopping), stats.complete or stats.ended, last)
            ended = False
            if plan.evaluate:
                ended = bool(hooks.epoch_end())
            record = _record(run, stats, recipe, plan.evaluate, epoch)
            if plan.record == "stop":
                stopped = _stop_inside_epoch(run, stats, record, boundary,
                                             None if plan.evaluate else boundary.why())
                if plan.preempt:
                    raise boundary.preempted(state, stopped["checkpoint"], state.epoch_samples)
                last_record = stopped
                break
            state.epoch += 1
            state.epoch_samples = state.epoch_skipped = 0
            _log_epoch(run, epoch, epochs_in_all, stats, record, plan.evaluate)
            records.append(record)
            last_record = record
            # Asked to stop during the last step, the evaluation or just now, or a handler
            # asked to end training: every rank learns it here (one collective an epoch),
            # and the checkpoint is written now.
            asked, ended = (0, ended) if plan.preempt else boundary.stop_agreed(ended)
            asked = asked and not last
            if run.commit is not None:
                run.commit(state, "epoch done")
            due = plan.save_now or bool(asked) or ended or boundary.pending
            _gather(outputs, run.trainer, outputs.checkpointer is not None and
                    outputs.checkpointer.due(state, due))
            saved = []
            write_together(dist, lambda: saved.append(write_epoch(
                outputs, run.net, run.trainer, state, record, due,
                last or bool(asked) or plan.preempt or ended, run.watchdog,
                _scalars(run, record))), f"step {state.step}")
            if saved[0] or due:
                boundary.saved()
            if run.commit is not None:
                run.commit(state, "epoch written")
            if asked or plan.preempt:
                raise boundary.preempted(state, saved[0], 0)
            if ended or (cfg.max_steps is not None and state.step >= cfg.max_steps):
                break
    except BaseException:
        if outputs.checkpointer is not None:
            finish_writing(outputs.checkpointer, run.watchdog)
        raise
    finally:
        loop.layouts.close()
    hooks.train_end()
    total_time = time.perf_counter() - run_start
    end = {name: value for name, value in (last_record or {}).items()
           if name.startswith(run.prefixes[1] + "_") or name.startswith("ema_")}

    def write_end():
        outputs.metrics.write("end", **end, total_time=total_time, step=state.step)
        if outputs.tensorboard is not None:
            outputs.tensorboard.close()

    write_together(dist, write_end, f"step {state.step}")
    for line in summary_lines(records, total_time, dist.num_workers, len(run.devices),
                              cfg.kvstore, outputs.written(), stopped, run.prefixes[1]):
        logger.info("%s", line)
    return dict(end, total_time=total_time, steps=state.step)


def _scalars(run: RunParts, record: dict) -> Dict[str, Optional[float]]:
    """An epoch's TensorBoard scalars: the training loss and every metric of both splits,
    the throughput and the learning rate."""
    train, val = run.prefixes
    val_book = getattr(run.hooks, "val_book", None)  # the Estimator's
    names = [f"{train}_loss"] + [f"{train}_{name}" for name in run.train_book.names()] \
        + [f"{val}_{name}" for name in (val_book.names() if val_book is not None else [])]
    scalars = {name: record.get(name) for name in names}
    scalars.update({f"{train}_samples_per_sec": record["samples_per_sec"],
                    f"{train}_lr": record["lr"]})
    return scalars


def _split_size(feed) -> int:
    """The training split's sample count (what ``max_bad_samples`` is a share of)."""
    return int(getattr(feed, "num_samples", 0) or getattr(feed.sampler, "length", 0))


def _record(run: RunParts, stats: EpochStats, recipe: Recipe, evaluated: bool,
            epoch: int) -> dict:
    """An epoch's (or a stop's) record: where, the training figures over every rank, the
    validation's (None each when not evaluated), the recipe's and the batch processor's,
    and the unusable samples. The metrics' fields are their books' (never the run's own:
    :mod:`~hvdtrain.loop.engine.metrics`)."""
    train, val = run.prefixes
    record = dict(epoch=epoch, step=run.state.step, **{f"{train}_loss": stats.loss},
                  **{f"{train}_{name}": value for name, value in run.train_book.values().items()},
                  **{f"{train}_samples": stats.samples},
                  **run.hooks.validation(evaluated),
                  samples_per_sec=stats.samples_per_sec, epoch_time=stats.seconds,
                  lr=run.trainer.learning_rate, num_workers=run.dist.num_workers,
                  batch_size=run.cfg.batch_size)
    record.update(run.hooks.epoch_figures(epoch))
    record.update(recipe.train_figures())
    if evaluated:
        record.update(run.hooks.average_validation())
    record.update(count_skipped(stats, run.hooks.val_feed, run.dist, epoch, evaluated))
    return record


def _stop_inside_epoch(run: RunParts, stats: EpochStats, record: dict, boundary: Boundary,
                       reason: Optional[str]) -> dict:
    """Record a stop inside an epoch (``max_steps``, or the stop asked for `reason`, whose
    evaluation is skipped) with what the part of the epoch that ran measured, save its
    checkpoint and wait for it; return that record. The epoch is not counted as done; its
    checkpoint keeps the samples processed so that a resume runs only the rest."""
    state, outputs = run.state, run.outputs
    record = dict(epoch=state.epoch, step=state.step, epoch_samples=state.epoch_samples,
                  steps=stats.steps,
                  **{k: v for k, v in record.items() if k not in ("epoch", "step")},
                  **({"stopped_by": reason} if reason else {}))
    logger.info("stopped at step %d, %d of %d samples into epoch %d  %s  %.1f samples/s over "
                "%d steps in %.2fs", state.step, min(state.epoch_samples, _split_size(
                    run.train_feed)), _split_size(run.train_feed), state.epoch + 1,
                _figures_text(run, record, reason is None, "not evaluated"),
                stats.samples_per_sec, stats.steps, stats.seconds)

    def write():
        outputs.metrics.write("stop", **record)
        record["checkpoint"] = checkpoint(outputs, run.net, run.trainer, state, True,
                                          run.watchdog, wait=True)

    if boundary.before_save is not None:
        boundary.before_save(state)
    if run.replicas is not None:
        run.replicas.verify(f"the stop's checkpoint (step {state.step})", statistics=False,
                            state=state)
    _gather(outputs, run.trainer, True)
    write_together(run.dist, write, f"step {state.step}")
    return record


def _gather(outputs: Outputs, trainer, due: bool) -> None:
    """On every rank, before rank 0 saves a checkpoint that is `due`: what it needs from
    all of them (a collective when the trainer compresses: PowerSGD's errors are summed)."""
    if outputs.checkpointer is not None:
        outputs.checkpointer.gather(trainer, due)


def _figures_text(run: RunParts, record: dict, evaluated: bool,
                  unevaluated: str = "not evaluated (stopping)") -> str:
    """The log line's figures of `record`: the training loss and metrics, then the
    validation's (or `unevaluated`)."""
    train, val = run.prefixes
    words = [f"{train} loss {record[f'{train}_loss']:.4f}"]
    for metric in run.train_book.metrics:
        words += _metric_words(metric, train, record)
    if not evaluated:
        words.append(unevaluated)
    else:
        for metric in getattr(run.hooks, "val_metrics", []):
            words += _metric_words(metric, val, record)
    return "  ".join(words)


def _metric_words(metric, prefix: str, record: dict) -> List[str]:
    name = record_name(metric)
    label = getattr(metric, "log_name", None)
    label = f"{prefix} {name}" if label is None else label
    value = record.get(f"{prefix}_{name}")
    if not label or value is None:
        return []
    return [f"{label} {value:.4f}"]


def _log_epoch(run: RunParts, epoch: int, epochs: int, stats: EpochStats, record: dict,
               evaluated: bool) -> None:
    logger.info("epoch %d/%d  %s  %.1f samples/s  %.2fs%s", epoch + 1, epochs,
                _figures_text(run, record, evaluated), stats.samples_per_sec, stats.seconds,
                log_suffix(record))
