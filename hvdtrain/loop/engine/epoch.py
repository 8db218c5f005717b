"""One epoch of training: the step every rank repeats, and the state it advances.

One step: split the batch over the worker's devices, forward and backward under autograd,
``trainer.step(global batch)``. With ``accumulate`` N > 1, N micro-batches add their
gradients (``grad_req='add'``) before one ``step`` over all their samples. The store *sums*
gradients over workers and ``step`` divides by the samples that contributed on all workers
together (:class:`~hvdtrain.loop.engine.counts.StepCounts`), so the update uses the gradient
averaged over the global batch, the same divisor on every rank even when a streamed loader
left an unusable sample out of one rank's batch, and ``--lr`` is the rate for that batch.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import mxnet as mx
from mxnet import autograd, gluon

from . import precision
from ..run.boundary import Boundary
from .batches import clear_gradients, split_batch, zero_gradients
from ..recipe.clipping import GradClipper
from ..recipe.ema import WeightAverage
from ..recipe.mixing import Mixing, mixed_batch
from .counts import StepCounts, check_bad_samples
from ...store.dist import DistContext
from .evaluate import tally_batch
from .guard import FiniteGuard
from ...report.progress import progress_bar
from ...runtime.watchdog import Watchdog
from ...state import compression_state
from ...state.train_state import TrainState
from ...store.gluon_internals import set_loss_scale

logger = logging.getLogger("hvdtrain")

PROGRESS_EVERY = 10  # steps between loss and throughput updates of the progress bar


@dataclass(frozen=True)
class EpochStats:
    """Training totals of one epoch over all ranks."""

    loss: float
    accuracy: float
    samples: int
    seconds: float
    complete: bool = True
    steps: int = 0  # optimizer steps this rank ran in it (this run's part of the epoch)

    skipped: int = 0  # samples left out as unusable, over all ranks (this run's part)
    # ... and over the whole epoch, the part before a stop and resume inside it included
    epoch_skipped: int = 0

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Loop:
    """What every step of a run uses: the model, its trainer and where it runs."""

    net: object
    trainer: gluon.Trainer
    devices: list
    dist: DistContext
    lr_for_step: Callable[[int], float]
    guard: FiniteGuard
    steps_per_epoch: int = 0
    max_steps: Optional[int] = None
    log_interval: int = 0
    progress: bool = False
    policy: precision.Precision = precision.Precision()
    watchdog: Optional[Watchdog] = None
    label_smoothing: float = 0.0
    accumulate: int = 1  # micro-batches per optimizer step
    max_bad_samples: str = "1%"  # unusable training samples an epoch may have (--max-bad-samples)
    train_size: int = 0  # samples of the training split (what the limit is a share of)
    # Elastic training's hook, called as commit(state, "step") after every step but an
    # epoch's last (fit calls it at the epoch's end: see fit).
    commit: Optional[Callable[[TrainState, str], None]] = None
    # Save and stop decisions, voted with each step's counts (loop/run/boundary.py).
    boundary: Optional[Boundary] = None
    # The training recipe (docs/training.md): --mixup/--cutmix, --clip-grad-norm, --ema.
    mixing: Optional[Mixing] = None
    clipper: Optional[GradClipper] = None
    ema: Optional[WeightAverage] = None


def training_loss(smoothing: float):
    """Softmax cross-entropy against the labels, or (`smoothing` > 0) against targets of
    ``1 - smoothing + smoothing / classes`` for the true class and ``smoothing / classes``
    for every other (GluonCV's ``--label-smoothing``)."""
    if not smoothing:
        return gluon.loss.SoftmaxCrossEntropyLoss()
    dense = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def smoothed(out, label):
        classes = out.shape[1]
        target = mx.nd.one_hot(label, classes, on_value=1 - smoothing + smoothing / classes,
                               off_value=smoothing / classes)
        return dense(out, target.astype(out.dtype, copy=False))
    return smoothed


def train_epoch(loop: Loop, loader, state: TrainState) -> EpochStats:
    """Run one epoch (or until `max_steps`) and return its totals over all ranks
    (this rank's own under ``dist_async``).

    Loss and accuracy accumulate on the device; the host reads them only at log intervals,
    finite checks and the end of the epoch, so steps are not serialised by host syncs.
    """
    loss_fn = training_loss(loop.label_smoothing)
    dist, device = loop.dist, loop.devices[0]
    correct = mx.nd.zeros(1, ctx=device)
    loss_sum = mx.nd.zeros(1, ctx=device)
    samples = 0
    bar = progress_bar(loop.progress, len(loader), f"epoch {state.epoch + 1}")
    # An optimizer step takes `accumulate` micro-batches (the epoch's last step takes what
    # is left: every rank has the same number of micro-batches, so all step together).
    accumulate = loop.accumulate
    micro_batches = len(loader)  # the epoch's rest after a resume
    steps_left = -(-micro_batches // accumulate)
    # Steps of this epoch run before a resume (none in an epoch started afresh).
    per_epoch = loop.steps_per_epoch or steps_left
    done = max(per_epoch - steps_left, 0)
    ran, steps, step_used, step_skipped, skipped = 0, 0, 0, 0, 0
    # A loader that can leave unusable samples out (streamed images) makes batches of
    # different sizes on different ranks: the step's divisor is summed over them. So is
    # every rank's vote on saving and stopping, in every run that has one (all but --elastic):
    # one exchange a step whatever the loader.
    boundary = loop.boundary
    counts = StepCounts(dist, exchange=dist.synchronous and dist.num_workers > 1 and (
        boundary is not None or hasattr(loader, "skipped")))
    mixing = loop.mixing if loop.mixing is not None and loop.mixing.active(state.epoch) else None
    start = time.perf_counter()
    for batch, (images, labels) in enumerate(loader, 1):
        if (batch - 1) % accumulate == 0:  # the first micro-batch of a step
            # --max-steps and a stop request stop at a step boundary only: a checkpoint
            # never holds part of a step's gradient sum.
            if (loop.max_steps is not None and state.step >= loop.max_steps) or \
                    (boundary is not None and boundary.stopping):
                break
            # The schedule follows the position in the epoch, so it does not depend on how
            # many workers earlier epochs ran with (a resumed run may have a different count).
            loop.trainer.set_learning_rate(
                loop.lr_for_step(state.epoch * per_epoch + done + steps))
        last_of_step = batch % accumulate == 0 or batch == micro_batches
        # Positions of the epoch's order this batch consumed (the last batch may be short).
        positions = min(loader.batch_size, len(loader.sampler) - (batch - 1) * loader.batch_size)
        step_used += len(labels)
        step_skipped += positions - len(labels)
        if last_of_step:  # summed over the workers while this batch computes
            counts.submit(step_used, step_skipped, boundary.vote() if boundary else ())
        if len(labels):
            # Drawn from where the batch starts in the epoch's order: a resume repeats it.
            draw = None if mixing is None else mixing.draw(
                state.epoch, state.epoch_samples, dist.rank, *images.shape[2:])
            batch_loss = _forward_backward(loop, loss_fn, images, labels, device, correct,
                                           loss_sum, draw)
            loop.guard.observe(batch_loss, state.step + 1)
        else:
            # Every sample of this batch was unusable: this rank adds nothing, but its
            # gradients must still be fresh zeros, as the step exchanges and checks them.
            sample = mx.nd.zeros((1,) + images.shape[1:], dtype=loop.policy.input_dtype)
            for each in loop.devices:
                zero_gradients(loop.net, sample, each)
        samples += len(labels)
        # Positions of the epoch's order consumed, not samples trained on: a resume must
        # start after the unusable ones too.
        state.epoch_samples += loader.batch_size * dist.num_workers
        ran = batch
        if bar is not None:
            bar.update(1)
        if not last_of_step:
            continue  # more micro-batches add to this step's gradients
        used, left_out, votes = counts.result()
        skipped += left_out
        state.epoch_skipped += left_out  # the epoch's, across a stop and resume inside it
        if dist.synchronous:
            # The gradients summed over the step's micro-batches and the workers: the
            # update averages them over all the samples they came from, on every rank.
            if used:
                _update(loop, used, state.step + 1)
            else:  # no sample anywhere: no update, but the run's step count goes on
                compression_state.step_skipped(loop.trainer)
        elif step_used:
            # Each push is applied alone, and MXNet fixes the servers' rescaling at the
            # first step: a short last batch is scaled as a full one.
            loop.trainer.step(loader.batch_size)
        if accumulate > 1:
            clear_gradients(loop.net)
        step_used, step_skipped = 0, 0
        steps += 1
        state.step += 1
        loop.guard.check(state.step)
        if left_out:  # the same global figures on every rank: all stop together
            check_bad_samples("training", state.epoch_skipped, loop.train_size,
                              loop.max_bad_samples, loader.skipped, state.epoch)
        if loop.watchdog is not None:
            loop.watchdog.beat(f"training step {state.step} (epoch {state.epoch + 1})")
        if boundary is not None:
            boundary.after_step(votes, state, last_of_epoch=batch == micro_batches)
        if loop.commit is not None and batch != micro_batches:
            loop.commit(state, "step")
        if bar is not None:
            if steps % PROGRESS_EVERY == 0:  # reading the loss waits for the device
                bar.set_postfix(loss=f"{loss_sum.asscalar() / max(samples, 1):.4f}",
                                img_s=f"{samples * dist.num_workers / (time.perf_counter() - start):.0f}")
        elif loop.log_interval and steps % loop.log_interval == 0 and \
                logger.isEnabledFor(logging.INFO):
            elapsed = time.perf_counter() - start
            logger.info("  step %d/%d  loss %.4f (rank 0)  %.1f samples/s (global)",
                        done + steps, per_epoch, loss_sum.asscalar() / max(samples, 1),
                        samples * dist.num_workers / elapsed)
    if bar is not None:
        bar.close()
    loop.guard.check(state.step, force=True)
    totals = mx.nd.concat(loss_sum, correct, mx.nd.array([samples], ctx=device), dim=0)
    totals.wait_to_read()
    seconds = time.perf_counter() - start
    if dist.synchronous:
        totals = dist.sum_across_workers("train_totals", totals.as_in_context(mx.cpu()))
    loss_total, correct_total, seen = (float(v) for v in totals.asnumpy())
    if skipped and ran == micro_batches:  # a whole pass: was anything usable at all?
        check_bad_samples("training", state.epoch_skipped, loop.train_size,
                          loop.max_bad_samples, loader.skipped, state.epoch, used=int(seen))
    return EpochStats(loss=loss_total / max(seen, 1), accuracy=correct_total / max(seen, 1),
                      samples=int(seen), seconds=seconds, complete=ran == micro_batches,
                      steps=steps, skipped=skipped, epoch_skipped=state.epoch_skipped)


def _update(loop: Loop, samples: int, step: int) -> None:
    """Optimizer step `step` over the gradients of `samples` samples (all workers'),
    clipped with ``--clip-grad-norm``, then averaged into ``--ema``."""
    # Under AMP, this step's loss scale from the scaler every rank holds alike: a rank
    # whose whole step was unusable ran no backward pass to set it.
    set_loss_scale(loop.trainer)
    if loop.clipper is not None:
        loop.clipper.step(loop.trainer, samples)
    else:
        loop.trainer.step(samples)
    if loop.ema is not None:
        loop.ema.update(step)


def _forward_backward(loop: Loop, loss_fn, images, labels, device, correct, loss_sum,
                      draw=None):
    """Forward and backward of one (micro-)batch over the worker's devices, mixed by
    `draw` (``--mixup``/``--cutmix``) when given; adds its correct count (against the
    dominant labels of a mixed batch) and loss sum to the epoch's (on `device`) and returns
    the loss sum."""
    if draw is None:
        xs, ys, idle = split_batch(images, labels, loop.devices, loop.policy.input_dtype)
        targets = ys
    else:
        xs, targets, ys, idle = mixed_batch(loop.mixing, draw, images, labels, loop.devices,
                                            loop.policy.input_dtype)
        loss_fn = loop.mixing.loss
    with autograd.record():
        outs = [loop.net(x) for x in xs]
        losses = [loss_fn(o, t) for o, t in zip(outs, targets)]
    loop.policy.backward(losses, loop.trainer)
    for idle_device in idle:  # an epoch's last batch had fewer samples than devices
        zero_gradients(loop.net, xs[0][:1], idle_device)
    batch_correct, batch_loss = tally_batch(outs, ys, losses, device)
    correct += batch_correct
    loss_sum += batch_loss
    return batch_loss
