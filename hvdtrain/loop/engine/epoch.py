"""One epoch of training, for any model: the step every rank repeats, and the state it
advances.

A batch is whatever the feed yields; the run's batch processor turns it into a forward and
backward pass (``fit_batch``) and says how many samples it holds (``batch_samples``). One
step: the processor's forward and backward over the batch (``accumulate`` N > 1:
N micro-batches add their gradients, ``grad_req='add'``), then ``trainer.step(global
count)``. The store *sums* gradients over workers and ``step`` divides by the samples that
contributed on all workers together (:class:`~hvdtrain.loop.engine.counts.StepCounts`), so
the update uses the gradient averaged over the global batch, the same divisor on every rank
even when a batch held fewer usable samples on one rank, and the learning rate is the rate
for that batch. A loss that divides its own gradient by a count of the batch (the
processor's ``loss_divisor``) has each rank's gradients multiplied by its count before the
exchange and the step divided by the counts summed over the ranks too (:mod:`.divisors`).
A rank (or a device) with no sample in a step runs no pass at all: its gradients are zeros,
marked fresh (:func:`~.batches.settle_idle_devices`).

Batch handlers (the Estimator's ``batch_begin``/``batch_end``) run around every batch on
every rank, one that holds no usable sample included (given as None); a ``batch_end`` that
asks to end the epoch is agreed by the ranks through the next step's exchange (the step that
carries the request is not applied) or, alone, at once.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import mxnet as mx

from . import precision
from .batches import clear_gradients, settle_idle_devices
from .counts import LeftOut, StepCounts, check_bad_samples, with_gradients
from .divisors import StepDivisors, as_parts, check_divisor
from .guard import FiniteGuard
from .step_seeds import StepSeeds
from .step_verdict import StepVerdict
from ...report.progress import progress_bar
from ...runtime.watchdog import Watchdog
from ...state import compression_state
from ...state.train_state import TrainState
from ...store.dist import DistContext
from ...store.gluon_internals import (discard_gradients, mark_gradients_used, set_loss_scale,
                                      trainer_params)

logger = logging.getLogger("hvdtrain")

PROGRESS_EVERY = 10  # steps between loss and throughput updates of the progress bar


@dataclass(frozen=True)
class EpochStats:
    """Training totals of one epoch over all ranks."""

    loss: float  # the mean of the per-sample training losses
    samples: int
    seconds: float
    complete: bool = True  # every batch of the epoch ran
    steps: int = 0  # optimizer steps this rank ran in it (this run's part of the epoch)
    skipped: int = 0  # samples left out as unusable, over all ranks (this run's part)
    # ... and over the whole epoch, the part before a stop and resume inside it included
    epoch_skipped: int = 0
    ended: bool = False  # a batch handler ended the epoch before its last batch

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


class BatchHooks:
    """What runs around every batch besides the step: the Estimator's batch handlers. The
    default runs nothing."""

    def batch_begin(self, batch) -> None:
        """Before the batch's forward pass; `batch` is None when it holds no usable sample
        (there is no pass then)."""

    def batch_end(self, batch, out) -> bool:
        """After it (and after the step's update, on a step's last batch); `out` is the
        processor's (data, label, pred, loss), None with `batch` when it held no usable
        sample. True asks to end the epoch."""
        return False


@dataclass
class Loop:
    """What every step of a run uses: the model, its trainer, where it runs, and what turns
    a batch into a forward and backward pass."""

    net: object
    trainer: object
    devices: list
    dist: DistContext
    # The schedule: the learning rate of each optimizer step (counted from 0 over the run);
    # None leaves the trainer's own rate alone.
    lr_for_step: Optional[Callable[[int], float]]
    guard: FiniteGuard
    steps_per_epoch: int = 0
    max_steps: Optional[int] = None
    log_interval: int = 0
    progress: bool = False
    policy: precision.Precision = precision.Precision()
    watchdog: Optional[Watchdog] = None
    accumulate: int = 1  # micro-batches per optimizer step
    max_bad_samples: str = "1%"  # unusable training samples an epoch may have
    train_size: int = 0  # samples of the training split (what the limit is a share of)
    # Elastic training's hook, called as commit(state, "step") after every step but an
    # epoch's last (fit calls it at the epoch's end: see fit).
    commit: Optional[Callable[[TrainState, str], None]] = None
    # Save and stop decisions, voted with each step's counts (loop/run/boundary.py).
    boundary: Optional[object] = None
    # --clip-grad-norm's clipper and --ema's average (loop/recipe/).
    clipper: Optional[object] = None
    ema: Optional[object] = None
    # The batch processor (fit_batch, batch_samples), what it and the handlers are given as
    # "the estimator", the batch axis it splits on, and the batch handlers.
    processor: Optional[object] = None
    context: Optional[object] = None
    batch_axis: int = 0
    hooks: BatchHooks = BatchHooks()
    # Settles MKL-DNN's weight layouts after an inference pass, before a step (.layouts).
    layouts: Optional[object] = None
    # The run's seed: MXNet's generators are seeded from it, the rank and the step before
    # every step that draws random numbers (.step_seeds); None leaves them alone.
    seed: Optional[int] = None


def train_epoch(loop: Loop, loader, state: TrainState) -> EpochStats:
    """Run one epoch (or until ``max_steps``) and return its totals over all ranks
    (this rank's own under ``dist_async``).

    The loss accumulates on the device; the host reads it only at log intervals, finite
    checks and the end of the epoch, so steps are not serialised by host syncs.
    """
    dist, device = loop.dist, loop.devices[0]
    params = trainer_params(loop.trainer)
    amp_scaled = loop.policy.amp
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
    ran, steps, step_used, step_skipped, step_consumed, skipped = 0, 0, 0, 0, 0, 0
    step_loss = None  # this step's loss sum, added to the epoch's once the step is applied
    # Every rank's sample counts and its votes (save, stop, end the epoch) are summed once a
    # step in every synchronous run of several workers that votes, whatever the loader.
    boundary = loop.boundary
    # A processor whose losses divide their own gradient by a count of the batch says by
    # what (divisors.py): its gradients are made sums again and the step divides by the
    # counts of every rank. Under dist_async each rank's update is its own batch's anyway.
    divides = dist.synchronous and bool(getattr(loop.processor, "divides", hasattr(
        loop.processor, "loss_divisor")))
    divisors = StepDivisors(loop.trainer, params) if divides else None
    left_out_of = LeftOut(loader, loop.batch_axis)  # the loader's unusable samples
    counts = StepCounts(dist, exchange=dist.synchronous and dist.num_workers > 1 and (
        boundary is not None or hasattr(loader, "skipped") or divides))
    # Sent right after the gradients where it can be (one round of Horovod's negotiation a
    # step, not two): the step's update then waits for both.
    early = with_gradients(loop.trainer, counts, divides, loop.clipper, amp_scaled)
    # A rank whose batch or pass raises steps on with zeros; its verdict rides the counts.
    verdict = StepVerdict(dist, shared=counts.exchange)
    end_asked, ended = False, False  # a batch handler asked to end the epoch
    seeds = StepSeeds(loop.seed, dist.rank, loop.devices, loop.net, loop.processor)
    start = time.perf_counter()
    for batch_number, batch in enumerate(loader, 1):
        if (batch_number - 1) % accumulate == 0:  # the first micro-batch of a step
            # --max-steps and a stop request stop at a step boundary only: a checkpoint
            # never holds part of a step's gradient sum.
            if (loop.max_steps is not None and state.step >= loop.max_steps) or \
                    (boundary is not None and boundary.stopping):
                break
            if end_asked and not counts.exchange:  # alone, the request needs no vote
                ended = True
                break
            if loop.layouts is not None:  # an evaluation or a handler's prediction ran
                loop.layouts.settle()
            seeds.before_step(state.step)  # what it draws, whether resumed or not
            if loop.lr_for_step is not None:
                # The schedule follows the position in the epoch, so it does not depend on
                # how many workers earlier epochs ran with.
                loop.trainer.set_learning_rate(
                    loop.lr_for_step(state.epoch * per_epoch + done + steps))
        last_of_step = batch_number % accumulate == 0 or batch_number == micro_batches
        # Positions of the epoch's order this batch consumed (the last batch may be short),
        # and those its step consumed on all ranks together.
        positions, consumed = _positions(loader, batch_number, dist.num_workers)
        used = verdict.call(loop.processor.batch_samples, batch, loop.batch_axis) or 0
        step_used += used
        # What the loader left out, not positions less `used`: a processor may count
        # objects or tokens (batch_samples), not the positions a batch consumed.
        step_skipped += left_out_of.of(batch, positions)
        if last_of_step and divisors is None and not early:  # summed while it computes
            votes = boundary.vote(end=end_asked) if boundary is not None else ()
            counts.submit(step_used, step_skipped, votes, later=True)  # sent after the pass
        out = None
        # The batch handlers run at every position, one with no usable sample here too
        # (batch and out None), so that what counts batches counts alike on every rank.
        loop.hooks.batch_begin(batch if used else None)
        if used:
            out = verdict.call(loop.processor.fit_batch, loop.context, batch, loop.batch_axis,
                               pass_=True)
        if out is None:  # no pass here, or it failed: as a batch with no usable sample
            step_used, used = step_used - used, 0
        else:
            batch_loss = _loss_sum(out[3], device)
            step_loss = batch_loss if step_loss is None else step_loss + batch_loss
            loop.guard.observe(batch_loss, state.step + 1)
        if divisors is not None:  # known once fit_batch ran: the pass is still computing
            _divide(loop, divisors, batch, out, last_of_step)
            if last_of_step:
                votes = boundary.vote(end=end_asked) if boundary is not None else ()
                counts.submit(step_used, step_skipped, votes, divisor=divisors.take(),
                              failed=verdict.failed)
        elif last_of_step and not early:
            counts.send(verdict.failed)
        if early and last_of_step:
            if step_used < len(loop.devices):  # zeros from a device with no backward pass
                settle_idle_devices(params, len(loop.devices))
            loop.trainer.allreduce_grads()
            votes = boundary.vote(end=end_asked) if boundary is not None else ()
            counts.submit(step_used, step_skipped, votes, failed=verdict.failed)
        # Positions of the epoch's order consumed, not samples trained on: a resume must
        # start after the unusable ones too.
        state.epoch_samples += consumed
        step_consumed += consumed
        ran = batch_number
        if bar is not None:
            bar.update(1)
        if not last_of_step:
            end_asked |= bool(loop.hooks.batch_end(batch if used else None, out))
            continue  # more micro-batches add to this step's gradients
        total_used, left_out, votes = counts.result()
        verdict.settle(counts.failed)  # a rank's step failed: every rank raises one line
        if boundary is not None and boundary.ends_epoch(votes):
            # A handler asked to end the epoch after the step before: every rank learns it
            # here, with this step's counts. This step is not applied, and the epoch ends
            # where the handler asked.
            discard_gradients(params)
            if divisors is not None:
                divisors.discard()
            state.epoch_samples -= step_consumed
            ran, ended = batch_number - ((batch_number - 1) % accumulate + 1), True
            break
        skipped += left_out
        state.epoch_skipped += left_out  # the epoch's, across a stop and resume inside it
        samples += step_used
        if step_loss is not None:
            loss_sum += step_loss
            step_loss = None
        if step_used < len(loop.devices) and not early:
            # A device with no backward pass this step (no sample for it) adds zeros.
            settle_idle_devices(params, len(loop.devices))
        if dist.synchronous:
            # The gradients summed over the step's micro-batches and the workers: the
            # update averages them over all the samples they came from, on every rank
            # (and, for losses that divide themselves, over every rank's divisor).
            divisor = total_used * (counts.divisor if divisors is not None else 1)
            if divisor:
                _update(loop, divisor, state.step + 1, exchanged=early)
            else:  # no sample (or no count) anywhere: no update, the step count goes on
                compression_state.step_skipped(loop.trainer)
        elif step_used:
            # Each push is applied alone, and MXNet fixes the servers' rescaling at the
            # first step: a short last batch is scaled as a full one.
            loop.trainer.step(loader.batch_size)
        if amp_scaled:  # an update AMP skipped for an overflow leaves them marked fresh
            mark_gradients_used(params)
        if accumulate > 1:
            clear_gradients(loop.net)
        step_used, step_skipped, step_consumed = 0, 0, 0
        steps += 1
        state.step += 1
        seeds.after_step()
        loop.guard.check(state.step)
        if left_out:  # the same global figures on every rank: all stop together
            check_bad_samples("training", state.epoch_skipped, loop.train_size,
                              loop.max_bad_samples, getattr(loader, "skipped", []),
                              state.epoch)
        if loop.watchdog is not None:
            loop.watchdog.beat(f"training step {state.step} (epoch {state.epoch + 1})")
        if boundary is not None:
            boundary.after_step(votes, state, last_of_epoch=batch_number == micro_batches)
        if loop.commit is not None and batch_number != micro_batches:
            loop.commit(state, "step")
        end_asked |= bool(loop.hooks.batch_end(batch if used else None, out))
        _report(loop, bar, steps, done, per_epoch, loss_sum, samples, start)
    if bar is not None:
        bar.close()
    loop.guard.check(state.step, force=True)
    totals = mx.nd.concat(loss_sum, mx.nd.array([samples], ctx=device), dim=0)
    totals.wait_to_read()
    seconds = time.perf_counter() - start
    if dist.synchronous:
        totals = dist.sum_across_workers("train_totals", totals.as_in_context(mx.cpu()))
    loss_total, seen = (float(v) for v in totals.asnumpy())
    if skipped and ran == micro_batches:  # a whole pass: was anything usable at all?
        check_bad_samples("training", state.epoch_skipped, loop.train_size,
                          loop.max_bad_samples, getattr(loader, "skipped", []), state.epoch,
                          used=int(seen))
    return EpochStats(loss=loss_total / max(seen, 1), samples=int(seen), seconds=seconds,
                      complete=ran == micro_batches and not ended, steps=steps,
                      skipped=skipped, epoch_skipped=state.epoch_skipped, ended=ended)


def _positions(loader, batch_number: int, num_workers: int):
    """(the positions of the epoch's order batch `batch_number` consumed on this rank; those
    its step consumed on all ranks together). A feed whose batches differ in size (a batch
    sampler's buckets) says (``batch_positions``); any other holds ``batch_size`` a batch."""
    if hasattr(loader, "batch_positions"):
        return loader.batch_positions(batch_number)
    size = loader.batch_size
    return min(size, len(loader.sampler) - (batch_number - 1) * size), size * num_workers


def _report(loop: Loop, bar, steps: int, done: int, per_epoch: int, loss_sum, samples: int,
            start: float) -> None:
    """The progress bar's figures, or a log line at ``log_interval``."""
    if bar is not None:
        if steps % PROGRESS_EVERY == 0:  # reading the loss waits for the device
            bar.set_postfix(loss=f"{loss_sum.asscalar() / max(samples, 1):.4f}",
                            img_s=f"{samples * loop.dist.num_workers / (time.perf_counter() - start):.0f}")
    elif loop.log_interval and steps % loop.log_interval == 0 and \
            logger.isEnabledFor(logging.INFO):
        elapsed = time.perf_counter() - start
        logger.info("  step %d/%d  loss %.4f (rank 0)  %.1f samples/s (global)",
                    done + steps, per_epoch, loss_sum.asscalar() / max(samples, 1),
                    samples * loop.dist.num_workers / elapsed)


def _loss_sum(losses, device) -> mx.nd.NDArray:
    """A batch's losses (an NDArray or a list of them, one per device) summed into a (1,)
    float32 NDArray on `device`, not waited for."""
    losses = losses if isinstance(losses, (list, tuple)) else [losses]
    parts = [l.sum().astype("float32", copy=False).as_in_context(device) for l in losses]
    return mx.nd.add_n(*parts) if len(parts) > 1 else parts[0]


def _divide(loop: Loop, divisors: StepDivisors, batch, out, last: bool) -> None:
    """Give `divisors` what this micro-batch's gradient is divided by (the processor's
    ``loss_divisor``), device by device; a rank that ran no pass adds nothing. A count of 0
    scales by 1: a loss that had nothing to divide by left its gradient as it was (MXNet's
    ``SoftmaxOutput`` and GluonCV's SSD loss divide by ``max(count, 1)``)."""
    if out is None:
        divisors.add([], 0.0, [], last)
        return
    losses = out[3] if isinstance(out[3], (list, tuple)) else [out[3]]
    factors, count = as_parts(loop.processor.loss_divisor(batch, out), len(losses))
    check_divisor(count, f"{type(loop.processor).__name__}.loss_divisor")
    for factor in factors:
        check_divisor(factor, f"{type(loop.processor).__name__}.loss_divisor")
    devices = [loop.devices.index(part.context)
               if getattr(part, "context", None) in loop.devices else i
               for i, part in enumerate(losses)]
    divisors.add([f if f else 1.0 for f in factors], count, devices, last)


def _update(loop: Loop, samples: int, step: int, exchanged: bool = False) -> None:
    """Optimizer step `step` over the gradients of `samples` samples (all workers';
    `exchanged`: summed already), clipped with ``--clip-grad-norm``, then averaged into
    ``--ema``."""
    # Under AMP, this step's loss scale from the scaler every rank holds alike: a rank
    # whose whole step was unusable ran no backward pass to set it.
    set_loss_scale(loop.trainer)
    if loop.clipper is not None:
        loop.clipper.step(loop.trainer, samples)
    elif exchanged:
        loop.trainer.update(samples)
    else:
        loop.trainer.step(samples)
    if loop.ema is not None:
        loop.ema.update(step)
