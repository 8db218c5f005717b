"""What a run writes as it trains (rank 0 alone): metrics records, TensorBoard scalars and
checkpoints, and the figures its records share. :func:`hvdtrain.loop.run.fit.fit` decides when.
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import mxnet as mx

from ...report.log import MetricsWriter
from ...report.progress import TensorBoardWriter
from ...runtime.watchdog import Watchdog
from ...state.checkpoint import Checkpointer
from ...state.checkpoint_files import CHECKPOINTS
from ...state.train_state import TrainState
from ...state.writes import OutputError
from ...store.dist import DistContext

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


def count_skipped(stats, test_loader, dist: DistContext, epoch: int,
                  evaluated: bool = True) -> dict:
    """Samples left out this epoch as unusable (unreadable or undecodable), over all ranks,
    as the metrics record's fields; rank 0 warns once with the totals (each rank has already
    named its own bad samples, one warning each). In-memory loaders leave none out.

    The training count is the epoch's steps' own (`stats`: summed with each step's counts,
    the part before a stop and resume inside the epoch included), not what the loader
    decoded: at a stop it has decoded batches ahead that no step trained on, and trains
    them after the resume. The validation count is the evaluation's, None when the epoch
    was not `evaluated` (a stop skipped it)."""
    if not hasattr(test_loader, "skipped"):
        return dict(skipped_train_samples=0, skipped_val_samples=0 if evaluated else None)
    train = int(stats.epoch_skipped)
    val = None
    if evaluated:
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


def figures(stats, result, trainer, dist: DistContext, batch_size: int) -> dict:
    """What an epoch's record and a stop's record both say about the training measured;
    the test figures are None when the stop skipped the evaluation (`result` None)."""
    # The sample counts over all ranks, so that a reader can check each epoch's coverage.
    tested = dict(test_acc=None, test_samples=None, test_top5=None, test_loss=None)
    if result is not None:
        tested = dict(test_acc=result.accuracy, test_samples=int(result.count),
                      test_top5=result.top5, test_loss=result.loss)
    return dict(train_loss=stats.loss, train_acc=stats.accuracy, train_samples=stats.samples,
                **tested, samples_per_sec=stats.samples_per_sec, epoch_time=stats.seconds,
                lr=trainer.learning_rate, num_workers=dist.num_workers, batch_size=batch_size)


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
                wait: bool, watchdog: Optional[Watchdog]) -> Optional[str]:
    """Rank 0's writes after an epoch: its metrics record, scalars and checkpoint (see
    :func:`checkpoint`); returns the checkpoint's path, if one was started."""
    outputs.metrics.write("epoch", **record)
    if outputs.tensorboard is not None:
        scalars = dict(train_loss=record["train_loss"], train_acc=record["train_acc"],
                       test_loss=record["test_loss"], test_acc=record["test_acc"],
                       train_samples_per_sec=record["samples_per_sec"], train_lr=record["lr"])
        # An epoch stopped at its last step is not evaluated: no test scalars then.
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
