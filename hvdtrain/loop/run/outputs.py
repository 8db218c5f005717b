"""What a run writes as it trains (rank 0 alone): metrics records, TensorBoard scalars and
checkpoints, and the figures its records share. :func:`hvdtrain.loop.run.fit.fit` decides when.
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import mxnet as mx

from ...config import RunConfig
from ...options import interval_of
from ...report.log import MetricsWriter
from ...report.progress import TensorBoardWriter
from ...runtime.watchdog import Watchdog
from ...state.checkpoint import Checkpointer
from ...state.loss_scale import loss_scale_state
from ...state.writes import check_writable_dir
from ...state.checkpoint_files import CHECKPOINTS
from ...state.train_state import TrainState
from ...state.writes import OutputError
from ...store.dist import DistContext
from .boundary import host_copy

logger = logging.getLogger("hvdtrain")


@dataclass
class Outputs:
    """Where a run's results go; every part is a no-op off the root rank."""

    metrics: MetricsWriter = field(default_factory=lambda: MetricsWriter(None))
    checkpointer: Optional[Checkpointer] = None
    tensorboard: Optional[TensorBoardWriter] = None
    output_dir: Optional[str] = None
    # What the job saves in output_dir after fit(), for the summary to name.
    final_files: Tuple[str, ...] = ("model.params",)

    def written(self) -> List[str]:
        """What this rank writes, for the closing summary: each part only if it is on."""
        paths = []
        if self.metrics.path:
            paths.append(self.metrics.path)
        if self.checkpointer is not None and self.checkpointer.output_dir:
            paths.append(os.path.join(self.checkpointer.output_dir, CHECKPOINTS) + "/")
        if self.output_dir:
            paths += [os.path.join(self.output_dir, name) for name in self.final_files]
        if self.tensorboard is not None and self.tensorboard.writer is not None:
            paths.append(self.tensorboard.writer.logdir + "/ (TensorBoard)")
        return paths


def build_checkpointer(cfg: RunConfig, dist: DistContext, worker_batch: int,
                       meta: Optional[Dict] = None) -> Checkpointer:
    """Rank 0's checkpoint writer (a no-op elsewhere, or without an output folder); `meta`
    is more of every checkpoint's ``meta.json`` (the model, its card)."""
    meta = dict({"config": cfg.to_dict(), "num_workers": dist.num_workers,
                 "global_batch": cfg.global_batch(worker_batch, dist.num_workers),
                 "sampler_seed": cfg.seed, "kvstore": cfg.kvstore}, **(meta or {}))
    unit, every = interval_of(cfg.checkpoint_every)
    # Written in the background from a host copy, except under --elastic, whose resets
    # would run beside a write.
    saver = Checkpointer(cfg.output_dir, int(every) if unit == "epochs" else None,
                         cfg.keep_checkpoints, enabled=dist.is_root, meta=meta,
                         with_states=dist.synchronous,
                         host_copy=None if cfg.elastic else host_copy)
    saver.extra = loss_scale_state
    return saver


def build_outputs(cfg: RunConfig, dist: DistContext, worker_batch: int,
                  meta: Optional[Dict] = None,
                  final_files: Tuple[str, ...] = ("model.params",)) -> Outputs:
    """Metrics file, checkpoints and TensorBoard scalars, all written by rank 0 alone;
    `final_files` are what the run saves at its end (for the summary to name)."""
    if dist.is_root and cfg.tensorboard:  # before anything is written
        check_writable_dir(cfg.tensorboard, "--tensorboard")
    metrics_path = os.path.join(cfg.output_dir, "metrics.jsonl") if cfg.output_dir else None
    return Outputs(MetricsWriter(metrics_path, dist.is_root),
                   build_checkpointer(cfg, dist, worker_batch, meta),
                   TensorBoardWriter(cfg.tensorboard, dist.is_root), cfg.output_dir,
                   final_files)


def count_skipped(stats, test_loader, dist: DistContext, epoch: int,
                  evaluated: bool = True) -> dict:
    """Samples left out this epoch as unusable (unreadable or undecodable), over all ranks,
    as the metrics record's fields; rank 0 warns once with the totals (each rank has already
    named its own bad samples, one warning each). In-memory loaders leave none out.

    The training count is the epoch's steps' own (`stats`: summed with each step's counts,
    the part before a stop and resume inside the epoch included), not what the loader
    decoded: at a stop it has decoded batches ahead that no step trained on, and trains
    them after the resume. The validation count is the evaluation's, None when the epoch
    was not `evaluated` (a stop skipped it). Without a validation split, or with one whose
    loader leaves nothing out, the validation count is 0 (None when not evaluated); the
    training count is the steps' all the same."""
    train = int(stats.epoch_skipped)
    val = None
    if evaluated and not hasattr(test_loader, "skipped"):
        val = 0
    elif evaluated:
        mine = mx.nd.array([len(test_loader.skipped)])
        if dist.synchronous:
            mine = dist.sum_across_workers("skipped_samples", mine)
        val = int(mine.asnumpy()[0])
    # Without a synchronous store the counts are this rank's own: then each rank says its own.
    if (train or val) and (dist.rank == 0 or not dist.synchronous):
        logger.warning("epoch %d: %d training and %s validation sample(s) could not be read "
                       "or decoded and were left out (named in the warnings above, by the "
                       "rank that met them)", epoch + 1, train,
                       val if evaluated else "no (not evaluated)")
    return dict(skipped_train_samples=train, skipped_val_samples=val)


def checkpoint(outputs: Outputs, net, trainer, state: TrainState, due: bool,
               watchdog: Optional[Watchdog], wait: bool = False) -> Optional[str]:
    """Rank 0 starts the checkpoint due at an epoch's end or a stop (`due` forces one) and,
    with `wait`, waits until it is written (raising its failure); busy meanwhile, so that
    neither its watchdog nor those of the ranks waiting for it take a write to slow storage
    for a stall. Returns the checkpoint's path (None when none is saved)."""
    checkpointer = outputs.checkpointer
    if checkpointer is None:
        return None
    writing = watchdog is not None and checkpointer.output_dir is not None
    with watchdog.busy("writing a checkpoint") if writing else contextlib.nullcontext():
        path = checkpointer.after_epoch(net, trainer, state, last=due)
        if wait:
            checkpointer.wait()
    return path


def write_epoch(outputs: Outputs, net, trainer, state: TrainState, record: dict, due: bool,
                wait: bool, watchdog: Optional[Watchdog],
                scalars: Optional[Dict[str, Optional[float]]] = None) -> Optional[str]:
    """Rank 0's writes after an epoch: its metrics record, its TensorBoard `scalars` (by
    the record's names: ``train_loss`` is drawn as ``train/loss``) and checkpoint (see
    :func:`checkpoint`); returns the checkpoint's path, if one was started."""
    outputs.metrics.write("epoch", **record)
    if outputs.tensorboard is not None and scalars:
        # An epoch stopped at its last step is not evaluated: no validation scalars then.
        outputs.tensorboard.epoch(record["epoch"], **{name: value for name, value in
                                                      scalars.items() if value is not None})
    return checkpoint(outputs, net, trainer, state, due, watchdog, wait)


def finish_writing(checkpointer: Checkpointer, watchdog: Optional[Watchdog]) -> None:
    """When a run leaves by an error: let the checkpoint being written in the background
    finish (it is the newest good one), busy meanwhile. Its own failure is only logged: the
    error that ends the run says why it ends."""
    if not checkpointer.writing:
        return
    busy = watchdog.busy("writing a checkpoint") if watchdog is not None else \
        contextlib.nullcontext()
    try:
        with busy:
            checkpointer.wait()
    except OutputError as err:
        logger.warning("%s", err)
