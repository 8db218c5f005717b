""":func:`fit`: runs epochs of :mod:`hvdtrain.loop.epoch`, evaluates and writes the outputs.
It sees a Gluon ``Trainer`` and a :class:`DistContext`, never a backend; what it is handed is
made by :mod:`hvdtrain.loop.build`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import mxnet as mx

from . import precision
from ..state.checkpoint import Checkpointer
from ..state.checkpoint_files import CHECKPOINTS
from ..config import TrainConfig
from ..data.datasets import Dataset
from ..store.dist import DistContext
from .build import build_loaders
from .counts import check_bad_samples
from .epoch import Loop, train_epoch
from .finetune import apply_phase
from ..state.train_state import TrainState
from .evaluate import evaluate
from .guard import FiniteGuard
from .together import write_together
from ..report.log import MetricsWriter
from .replicas import average_running_stats
from ..report.progress import TensorBoardWriter, summary_lines
from .schedule import effective_base_lr, lr_at
from ..runtime.watchdog import Watchdog

logger = logging.getLogger("hvdtrain")

def count_skipped(train_loader, test_loader, dist: DistContext, epoch: int) -> dict:
    """Samples the loaders left out this epoch (unreadable or undecodable), over all ranks,
    as the metrics record's fields; rank 0 warns once with the totals (each rank has already
    named its own bad samples, one warning each). In-memory loaders leave none out."""
    if not hasattr(train_loader, "skipped"):
        return dict(skipped_train_samples=0, skipped_val_samples=0)
    mine = [len(loader.skipped) for loader in (train_loader, test_loader)]
    if dist.synchronous:
        mine = dist.sum_across_workers("skipped_samples", mx.nd.array(mine)).asnumpy()
    train, val = (int(n) for n in mine)
    # Without a synchronous store the counts are this rank's own: then each rank says its own.
    if (train or val) and (dist.rank == 0 or not dist.synchronous):
        logger.warning("epoch %d: %d training and %d validation sample(s) could not be read "
                       "or decoded and were left out (named in the warnings above, by the "
                       "rank that met them)", epoch + 1, train, val)
    return dict(skipped_train_samples=train, skipped_val_samples=val)


@dataclass
class Outputs:
    """Where a run's results go; every part is a no-op off the root rank."""

    metrics: MetricsWriter = field(default_factory=lambda: MetricsWriter(None))
    checkpointer: Optional[Checkpointer] = None
    tensorboard: Optional[TensorBoardWriter] = None
    output_dir: Optional[str] = None

    def written(self) -> List[str]:
        """What this rank writes, for the closing summary: each part only if it is on."""
        paths = []
        if self.metrics.path:
            paths.append(self.metrics.path)
        if self.checkpointer is not None and self.checkpointer.output_dir:
            paths.append(os.path.join(self.checkpointer.output_dir, CHECKPOINTS) + "/")
        if self.output_dir:  # the job saves model.params there after fit()
            paths.append(os.path.join(self.output_dir, "model.params"))
        if self.tensorboard is not None and self.tensorboard.writer is not None:
            paths.append(self.tensorboard.writer.logdir + "/ (TensorBoard)")
        return paths


def _figures(stats, result, trainer, dist: DistContext, batch_size: int) -> dict:
    """What an epoch's record and a stop's record both say about the training measured."""
    # The sample counts over all ranks, so that a reader can check each epoch's coverage.
    return dict(train_loss=stats.loss, train_acc=stats.accuracy, test_acc=result.accuracy,
                train_samples=stats.samples, test_samples=int(result.count),
                test_top5=result.top5, test_loss=result.loss,
                samples_per_sec=stats.samples_per_sec, epoch_time=stats.seconds,
                lr=trainer.learning_rate, num_workers=dist.num_workers, batch_size=batch_size)


def _stopped_inside_epoch(net, trainer, state: TrainState, outputs: Outputs, stats,
                          result, epoch_length: int, dist: DistContext,
                          watchdog: Optional[Watchdog], batch_size: int,
                          skipped: dict) -> dict:
    """Record a stop inside an epoch (``--max-steps``) with what the part of the epoch that
    ran measured (steps, time, throughput), and return that record. The epoch is not counted
    as done; its checkpoint keeps the samples processed so that a resume runs only the rest."""
    logger.info("stopped at step %d, %d of %d samples into epoch %d  train loss %.4f  "
                "train acc %.4f  test acc %.4f  top-5 %.4f  %.1f samples/s over %d steps in "
                "%.2fs", state.step, min(state.epoch_samples, epoch_length), epoch_length,
                state.epoch + 1, stats.loss, stats.accuracy, result.accuracy, result.top5,
                stats.samples_per_sec, stats.steps, stats.seconds)
    record = dict(epoch=state.epoch, step=state.step, epoch_samples=state.epoch_samples,
                  steps=stats.steps, **_figures(stats, result, trainer, dist, batch_size),
                  **skipped)

    def write():
        outputs.metrics.write("stop", **record)
        _checkpoint(outputs, net, trainer, state, True, watchdog)

    _gather(outputs, trainer, state, True)
    write_together(dist, write, f"step {state.step}")
    return record


def _epoch_outputs(outputs: Outputs, net, trainer, state: TrainState, record: dict,
                   last: bool, watchdog: Optional[Watchdog]) -> None:
    """Rank 0's writes after an epoch: its metrics record, scalars and checkpoint."""
    outputs.metrics.write("epoch", **record)
    if outputs.tensorboard is not None:
        outputs.tensorboard.epoch(record["epoch"], train_loss=record["train_loss"],
                                  train_acc=record["train_acc"], test_loss=record["test_loss"],
                                  test_acc=record["test_acc"],
                                  train_samples_per_sec=record["samples_per_sec"],
                                  train_lr=record["lr"])
    _checkpoint(outputs, net, trainer, state, last, watchdog)


def _gather(outputs: Outputs, trainer, state: TrainState, last: bool) -> None:
    """On every rank: what the checkpoint due (if any) needs from all of them (a
    collective when the trainer compresses: PowerSGD's errors are summed)."""
    if outputs.checkpointer is not None:
        outputs.checkpointer.gather(trainer, state, last)


def _checkpoint(outputs: Outputs, net, trainer, state: TrainState, last: bool,
                watchdog: Optional[Watchdog]) -> None:
    """Rank 0 writes the checkpoint due (if any): busy, so neither its watchdog nor those of
    the ranks waiting for it take a write to slow storage for a stall."""
    checkpointer = outputs.checkpointer
    if checkpointer is None:
        return
    writing = watchdog is not None and checkpointer.output_dir is not None
    with watchdog.busy("writing a checkpoint") if writing else contextlib.nullcontext():
        checkpointer.after_epoch(net, trainer, state, last=last)


def fit(net, trainer, data: Dataset, devices, dist: DistContext, cfg: TrainConfig,
        outputs: Optional[Outputs] = None, state: Optional[TrainState] = None,
        watchdog: Optional[Watchdog] = None,
        policy: Optional[precision.Precision] = None,
        commit: Optional[Callable[[TrainState, str], None]] = None) -> dict:
    """Train from `state` (default: the start) to ``cfg.epochs`` epochs, evaluating after
    each, writing `outputs`; return the final figures. Every completed step and evaluation
    batch beats `watchdog`, and rank 0 is busy for it while it writes a checkpoint; `policy`
    (default: the configuration's) says how the steps compute. `commit(state, point)` is
    elastic training's hook: `point` is ``"step"`` after every step but an epoch's last,
    ``"epoch done"`` once an epoch is trained and evaluated, before its outputs are written,
    and ``"epoch written"`` after them."""
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

    def lr_for_step(step):
        return lr_at(step, steps_per_epoch, base_lr, cfg.warmup_epochs, cfg.lr_decay_epochs,
                     cfg.lr_decay_factor, cfg.lr_schedule, cfg.epochs * steps_per_epoch)

    loop = Loop(net, trainer, devices, dist, lr_for_step,
                FiniteGuard(dist, devices[0], cfg.finite_check_every), steps_per_epoch,
                cfg.max_steps, cfg.log_interval, show_progress,
                policy or precision.Precision.of(cfg), watchdog, cfg.label_smoothing,
                cfg.accumulate, cfg.max_bad_samples, data.num_train, commit)
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
    result = None
    epochs, stopped = [], None
    while state.epoch < cfg.epochs:
        if cfg.max_steps is not None and state.step >= cfg.max_steps:
            break
        epoch = state.epoch
        apply_phase(net, trainer, cfg, epoch)  # --freeze-epochs: from the epoch alone
        train_loader.sampler.set_epoch(epoch, state.epoch_samples)
        stats = train_epoch(loop, train_loader, state)
        # Training stops here until the next epoch: what is evaluated now, checkpointed
        # below and saved at the end is one model, the same on every rank and device.
        average_running_stats(net, dist)
        test_loader.sampler.set_epoch(epoch)  # the same order; names the epoch it scores
        result = evaluate(net, test_loader, devices, dist, loop.policy.input_dtype,
                          on_batch=None if watchdog is None else
                          lambda b, e=epoch: watchdog.beat(f"evaluation batch {b} (epoch {e + 1})"))
        skipped = count_skipped(train_loader, test_loader, dist, epoch)
        if skipped["skipped_val_samples"] or not result.count:
            check_bad_samples("validation", skipped["skipped_val_samples"], data.num_test,
                              cfg.max_bad_samples, getattr(test_loader, "skipped", []), epoch,
                              used=int(result.count))
        if not stats.complete:
            stopped = _stopped_inside_epoch(net, trainer, state, outputs, stats, result,
                                            data.num_train, dist, watchdog, cfg.batch_size,
                                            skipped)
            break
        state.epoch += 1
        state.epoch_samples = 0
        logger.info("epoch %d/%d  train loss %.4f  train acc %.4f  test acc %.4f  "
                    "top-5 %.4f  %.1f samples/s  %.2fs", epoch + 1, cfg.epochs, stats.loss,
                    stats.accuracy, result.accuracy, result.top5, stats.samples_per_sec,
                    stats.seconds)
        record = dict(epoch=epoch, step=state.step,
                      **_figures(stats, result, trainer, dist, cfg.batch_size), **skipped)
        epochs.append(record)
        stopping = cfg.max_steps is not None and state.step >= cfg.max_steps
        if commit is not None:
            commit(state, "epoch done")
        last = stopping or state.epoch == cfg.epochs
        _gather(outputs, trainer, state, last)
        write_together(dist, lambda: _epoch_outputs(
            outputs, net, trainer, state, record, last, watchdog), f"step {state.step}")
        if commit is not None:
            commit(state, "epoch written")
        if stopping:
            break
    total_time = time.perf_counter() - run_start
    test_acc = result.accuracy if result else None

    def write_end():
        metrics.write("end", test_acc=test_acc, test_top5=result.top5 if result else None,
                      total_time=total_time, step=state.step)
        if outputs.tensorboard is not None:
            outputs.tensorboard.close()

    write_together(dist, write_end, f"step {state.step}")
    for line in summary_lines(epochs, total_time, dist.num_workers, len(devices), cfg.kvstore,
                              outputs.written(), stopped):
        logger.info("%s", line)
    return {"test_acc": test_acc, "test_count": result.count if result else 0,
            "total_time": total_time, "steps": state.step}
