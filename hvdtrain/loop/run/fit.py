""":func:`fit`: runs epochs of :mod:`hvdtrain.loop.engine.epoch`, evaluates and writes the outputs.
It sees a Gluon ``Trainer`` and a :class:`DistContext`, never a backend; what it is handed is
made by :mod:`hvdtrain.loop.engine.build`.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Optional

from ..engine import precision
from ...config import TrainConfig
from ...data.datasets import Dataset
from ...store.dist import DistContext
from ..engine.build import build_loaders
from ..engine.counts import check_bad_samples
from .boundary import Boundary
from ..engine.epoch import Loop, train_epoch
from ..recipe.parts import Recipe, log_suffix
from ..weights.finetune import apply_phase
from .outputs import (Outputs, checkpoint, count_skipped, figures, finish_writing,  # noqa: F401
                      write_epoch)
from ...state.train_state import TrainState
from ..engine.evaluate import evaluate
from ..engine.guard import FiniteGuard
from .together import write_together
from ..engine.replicas import average_running_stats
from ...report.progress import summary_lines
from ..engine.schedule import effective_base_lr, lr_at
from ...runtime.stop_signals import StopSignals
from ...runtime.watchdog import Watchdog

logger = logging.getLogger("hvdtrain")


def _stopped_inside_epoch(net, trainer, state: TrainState, outputs: Outputs, stats,
                          result, epoch_length: int, dist: DistContext,
                          watchdog: Optional[Watchdog], batch_size: int,
                          skipped: dict, recipe: dict,
                          reason: Optional[str] = None,
                          before_save: Optional[Callable] = None) -> dict:
    """Record a stop inside an epoch (``--max-steps``, or the stop asked for `reason`, whose
    evaluation is skipped: `result` None) with what the part of the epoch that ran measured
    (steps, time, throughput), save its checkpoint and wait for it; return that record. The
    epoch is not counted as done; its checkpoint keeps the samples processed so that a
    resume runs only the rest. `recipe`: what the training recipe adds to the record."""
    tested = (f"test acc {result.accuracy:.4f}  top-5 {result.top5:.4f}" if result is not None
              else "not evaluated")
    logger.info("stopped at step %d, %d of %d samples into epoch %d  train loss %.4f  "
                "train acc %.4f  %s  %.1f samples/s over %d steps in %.2fs", state.step,
                min(state.epoch_samples, epoch_length), epoch_length, state.epoch + 1,
                stats.loss, stats.accuracy, tested, stats.samples_per_sec, stats.steps,
                stats.seconds)
    record = dict(epoch=state.epoch, step=state.step, epoch_samples=state.epoch_samples,
                  steps=stats.steps, **figures(stats, result, trainer, dist, batch_size),
                  **recipe, **skipped, **({"stopped_by": reason} if reason else {}))

    def write():
        outputs.metrics.write("stop", **record)
        record["checkpoint"] = checkpoint(outputs, net, trainer, state, True, watchdog,
                                          wait=True)

    if before_save is not None:
        before_save(state)
    _gather(outputs, trainer, True)
    write_together(dist, write, f"step {state.step}")
    return record


def _gather(outputs: Outputs, trainer, due: bool) -> None:
    """On every rank, before rank 0 saves a checkpoint that is `due`: what it needs from
    all of them (a collective when the trainer compresses: PowerSGD's errors are summed)."""
    if outputs.checkpointer is not None:
        outputs.checkpointer.gather(trainer, due)


def fit(net, trainer, data: Dataset, devices, dist: DistContext, cfg: TrainConfig,
        outputs: Optional[Outputs] = None, state: Optional[TrainState] = None,
        watchdog: Optional[Watchdog] = None,
        policy: Optional[precision.Precision] = None,
        commit: Optional[Callable[[TrainState, str], None]] = None,
        signals: Optional[StopSignals] = None, ema=None) -> dict:
    """Train from `state` (default: the start) to ``cfg.epochs`` epochs, evaluating after
    each, writing `outputs`; return the final figures. Every completed step and evaluation
    batch beats `watchdog`, and rank 0 is busy for it while it writes a checkpoint; `policy`
    (default: the configuration's) says how the steps compute. `commit(state, point)` is
    elastic training's hook: `point` is ``"step"`` after every step but an epoch's last,
    ``"epoch done"`` once an epoch is trained and evaluated, before its outputs are written,
    and ``"epoch written"`` after them. `signals` notes this rank's stop requests: when any
    rank has one, every rank stops at the same step boundary, the checkpoint is saved, and
    :class:`~hvdtrain.loop.run.together.Preempted` is raised (loop/run/boundary.py). `ema` is the
    job's :class:`~hvdtrain.loop.recipe.ema.WeightAverage` (``--ema``; made here from the model when
    not given)."""
    state = state or TrainState()
    outputs = outputs or Outputs()
    metrics = outputs.metrics
    show_progress = logger.isEnabledFor(logging.INFO) and (
        cfg.progress if cfg.progress is not None else sys.stderr.isatty())
    train_loader, test_loader = build_loaders(data, cfg, dist, len(devices))
    # The last step of an epoch takes the micro-batches left when they do not divide by
    # --accumulate (loop.epoch.train_epoch).
    steps_per_epoch = -(-len(train_loader) // cfg.accumulate)
    if cfg.accumulate > len(train_loader):
        logger.warning("--accumulate %d is more than the %d micro-batches of an epoch here: "
                       "each epoch is one step over %d micro-batches", cfg.accumulate,
                       len(train_loader), len(train_loader))
    base_lr = effective_base_lr(cfg.lr, cfg.lr_scaling, dist.num_workers)
    if cfg.warmup_epochs and cfg.warmup_epochs >= cfg.epochs:  # e.g. a recipe line's 5 of 5
        logger.warning("--warmup-epochs %g covers the whole run of %d epochs (--epochs): the "
                       "learning rate only climbs to its peak and never follows --lr-schedule "
                       "%s; give --epochs more than the warm-up", cfg.warmup_epochs,
                       cfg.epochs, cfg.lr_schedule)

    def lr_for_step(step):
        return lr_at(step, steps_per_epoch, base_lr, cfg.warmup_epochs, cfg.lr_decay_epochs,
                     cfg.lr_decay_factor, cfg.lr_schedule, cfg.epochs * steps_per_epoch)

    recipe = Recipe.of(cfg, net, dist, data.num_classes, steps_per_epoch, ema)
    recipe.attach(outputs.checkpointer)
    loop = Loop(net, trainer, devices, dist, lr_for_step,
                FiniteGuard(dist, devices[0], cfg.finite_check_every), steps_per_epoch,
                cfg.max_steps, cfg.log_interval, show_progress,
                policy or precision.Precision.of(cfg), watchdog, cfg.label_smoothing,
                cfg.accumulate, cfg.max_bad_samples, data.num_train, commit,
                mixing=recipe.mixing, clipper=recipe.clipper, ema=recipe.ema)
    # Saves and stops voted at step boundaries, in every run: an elastic one too, which
    # commits to memory before each save (a peer that times out waiting for it rolls back
    # to there).
    boundary = Boundary(
        net, trainer, dist, outputs.checkpointer, cfg.checkpoint_every, signals, loop.guard,
        ema=recipe.ema,
        before_save=None if commit is None else lambda now: commit(now, "before save"))
    loop.boundary = boundary
    logger.info("training %s on %s: %d worker(s) x %d device(s) x batch %d%s = global batch "
                "%d, %d steps/epoch, lr %g for the global batch (scaling: %s, store: %s)",
                cfg.model_name, data.name, dist.num_workers, len(devices), cfg.batch_size,
                f" x {cfg.accumulate} micro-batches" if cfg.accumulate > 1 else "",
                cfg.global_batch(train_loader.batch_size, dist.num_workers), steps_per_epoch,
                base_lr, cfg.lr_scaling, cfg.kvstore)
    # Rank 0 writes; every rank learns whether it could (write_together), so a full disk
    # stops all of them at the same point instead of leaving them inside a collective.
    write_together(dist, lambda: metrics.write(
        "start", config=cfg.to_dict(), num_workers=dist.num_workers,
        steps_per_epoch=steps_per_epoch, devices=[str(d) for d in devices],
        start_epoch=state.epoch, start_step=state.step,
        start_epoch_samples=state.epoch_samples), "the start")
    run_start = time.perf_counter()
    result, trained = None, {}
    epochs, stopped = [], None
    try:
        while state.epoch < cfg.epochs:
            if cfg.max_steps is not None and state.step >= cfg.max_steps:
                break
            epoch = state.epoch
            apply_phase(net, trainer, cfg, epoch)  # --freeze-epochs: from the epoch alone
            train_loader.sampler.set_epoch(epoch, state.epoch_samples)
            stats = train_epoch(loop, train_loader, state)
            # Training stops here until the next epoch: what is evaluated now, checkpointed
            # below and saved at the end is one model, the same on every rank and device.
            average_running_stats(net, dist, recipe.statistics())
            asked = bool(boundary is not None and boundary.stopping)
            last = state.epoch + 1 >= cfg.epochs or (
                cfg.max_steps is not None and state.step >= cfg.max_steps)
            if asked and not stats.complete:  # saved at once: no evaluation
                record = _stopped_inside_epoch(
                    net, trainer, state, outputs, stats, None, data.num_train, dist, watchdog,
                    cfg.batch_size, count_skipped(stats, test_loader, dist, epoch, False),
                    recipe.train_figures(epoch), boundary.why(), boundary.before_save)
                raise boundary.preempted(state, record["checkpoint"], state.epoch_samples)
            # An epoch whose last step brought a stop request is saved unevaluated, unless
            # it ends the run.
            evaluated = not (asked and not last)
            result = _evaluate(net, test_loader, devices, dist, loop, watchdog, epoch) \
                if evaluated else None
            trained = dict(recipe.train_figures(epoch), **(recipe.ema_figures(
                lambda: _evaluate(net, test_loader, devices, dist, loop, watchdog, epoch))
                if evaluated else {}))
            skipped = count_skipped(stats, test_loader, dist, epoch, evaluated)
            if result is not None and (skipped["skipped_val_samples"] or not result.count):
                check_bad_samples("validation", skipped["skipped_val_samples"], data.num_test,
                                  cfg.max_bad_samples, getattr(test_loader, "skipped", []),
                                  epoch, used=int(result.count))
            if not stats.complete:
                stopped = _stopped_inside_epoch(net, trainer, state, outputs, stats, result,
                                                data.num_train, dist, watchdog,
                                                cfg.batch_size, skipped, trained,
                                                before_save=boundary.before_save)
                break
            state.epoch += 1
            state.epoch_samples = state.epoch_skipped = 0
            record = dict(epoch=epoch, step=state.step,
                          **figures(stats, result, trainer, dist, cfg.batch_size), **trained,
                          **skipped)
            logger.info("epoch %d/%d  train loss %.4f  train acc %.4f  %s  %.1f samples/s  "
                        "%.2fs%s", epoch + 1, cfg.epochs, stats.loss, stats.accuracy,
                        "not evaluated (stopping)" if result is None else
                        f"test acc {result.accuracy:.4f}  top-5 {result.top5:.4f}",
                        stats.samples_per_sec, stats.seconds, log_suffix(record))
            epochs.append(record)
            stopping = cfg.max_steps is not None and state.step >= cfg.max_steps
            # Asked to stop during the last step, the evaluation or just now: every rank
            # learns of it here (one collective an epoch), and the checkpoint is written now.
            asked = boundary is not None and not last and bool(boundary.stop_agreed())
            if commit is not None:
                commit(state, "epoch done")
            due = last or asked or (boundary is not None and boundary.pending)
            _gather(outputs, trainer, outputs.checkpointer is not None and
                    outputs.checkpointer.due(state, due))
            saved = []
            write_together(dist, lambda: saved.append(write_epoch(
                outputs, net, trainer, state, record, due, last or asked, watchdog)),
                f"step {state.step}")
            if boundary is not None and (saved[0] or due):
                boundary.saved()
            if commit is not None:
                commit(state, "epoch written")
            if asked:
                raise boundary.preempted(state, saved[0], 0)
            if stopping:
                break
    except BaseException:
        if outputs.checkpointer is not None:
            finish_writing(outputs.checkpointer, watchdog)
        raise
    total_time = time.perf_counter() - run_start
    test_acc = result.accuracy if result else None

    def write_end():
        metrics.write("end", test_acc=test_acc, test_top5=result.top5 if result else None,
                      total_time=total_time, step=state.step,
                      **({"ema_test_acc": trained.get("ema_test_acc")} if recipe.ema else {}))
        if outputs.tensorboard is not None:
            outputs.tensorboard.close()

    write_together(dist, write_end, f"step {state.step}")
    for line in summary_lines(epochs, total_time, dist.num_workers, len(devices), cfg.kvstore,
                              outputs.written(), stopped):
        logger.info("%s", line)
    return {"test_acc": test_acc, "test_count": result.count if result else 0,
            "total_time": total_time, "steps": state.step,
            **({"ema_test_acc": trained.get("ema_test_acc")} if recipe.ema else {})}


def _evaluate(net, test_loader, devices, dist: DistContext, loop: Loop,
              watchdog: Optional[Watchdog], epoch: int):
    """The epoch's evaluation: every test sample once over the ranks."""
    test_loader.sampler.set_epoch(epoch)  # the same order; names the epoch it scores
    return evaluate(net, test_loader, devices, dist, loop.policy.input_dtype,
                    on_batch=None if watchdog is None else
                    lambda b, e=epoch: watchdog.beat(f"evaluation batch {b} (epoch {e + 1})"))
