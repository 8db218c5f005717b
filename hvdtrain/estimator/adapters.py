"""How the engine (hvdtrain.loop) sees an Estimator's parts: its batch handlers around each
batch, the metric updates of an evaluation of the moving average, and its batch processor
(the sample count, the checks of what ``fit_batch`` and ``evaluate_batch`` return)."""
from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet.gluon.contrib import estimator as mx_estimator
from mxnet.gluon.contrib.estimator import event_handler as mx_handlers

from ..config import ConfigError
from ..loop.engine.draws import blocks_draw
from ..loop.engine.epoch import BatchHooks
from ..loop.engine.metrics import MetricBook
from .batch_processor import BatchProcessor, check_output, samples_in
from .loss_divisors import DivisorSource


class Handlers(BatchHooks):
    """An Estimator's batch handlers, as the engine calls them around each batch.

    They run at every step position, one where this rank's batch held no usable sample
    included (the engine passes ``None``): there a handler sees ``batch``, a batch with no
    sample (:func:`empty_batch`), and ``pred``, ``label`` and ``loss`` as empty lists, so
    that what counts batches counts alike on every rank."""

    def __init__(self, estimator, batch_begin, batch_end):
        self.estimator, self.begin, self.end = estimator, batch_begin, batch_end
        # An empty batch shaped as the last one with samples (not that batch itself, whose
        # memory it would hold on to).
        self._empty = empty_batch(None)

    def batch_begin(self, batch) -> None:
        if batch is None:
            batch = self._empty
        else:
            self._empty = empty_batch(batch, self.estimator.batch_axis)
        for handler in self.begin:
            handler.batch_begin(self.estimator, batch=batch)

    def batch_end(self, batch, out) -> bool:
        batch = self._empty if batch is None else batch
        _, label, pred, loss = out if out is not None else ([], [], [], [])
        asked = [handler.batch_end(self.estimator, batch=batch, pred=pred, label=label,
                                   loss=loss) for handler in self.end]
        return any(asked)


def empty_batch(like, batch_axis: int = 0):
    """A batch of no sample: `like` (a batch, or tuples, lists and dicts of arrays) with
    every array's `batch_axis` of length 0; without one, a (data, label) pair of empty
    arrays. MXNet's ``LoggingHandler`` reads ``batch[0].shape[0]`` (0 here)."""
    if like is None:
        return (mx.nd.empty((0,)), mx.nd.empty((0,)))
    if isinstance(like, (mx.nd.NDArray, np.ndarray)):
        shape = list(like.shape) or [0]
        shape[min(batch_axis, len(shape) - 1)] = 0
        if isinstance(like, np.ndarray):
            return np.empty(shape, like.dtype)
        return mx.nd.empty(tuple(shape), ctx=like.context, dtype=like.dtype)
    if isinstance(like, dict):
        return type(like)((key, empty_batch(value, batch_axis)) for key, value in like.items())
    if isinstance(like, (list, tuple)):
        parts = [empty_batch(value, batch_axis) for value in like]
        return type(like)(*parts) if hasattr(like, "_fields") else type(like)(parts)
    return like


class AverageMetrics(BatchHooks):
    """The metric updates of an evaluation of ``ema``'s average, into copies of the
    validation metrics."""

    def __init__(self, estimator, book: MetricBook):
        self.estimator, self.book = estimator, book

    def batch_end(self, batch, out) -> bool:
        if out is None:  # no usable sample in this rank's batch
            return False
        _, label, pred, loss = out
        for metric in self.book.metrics:
            if isinstance(metric, mx_handlers.metric_loss):
                self.book.update(metric, 0, loss)
            else:
                self.book.update(metric, label, pred)
        return False


# fit_batch methods that run the Estimator's net and loss and nothing else.
_PLAIN_FIT_BATCHES = (BatchProcessor.fit_batch, mx_estimator.BatchProcessor.fit_batch)


class Processor:
    """The Estimator's batch processor as the engine uses it: MXNet's two methods, the
    sample count (a processor without ``batch_samples`` counts its batches' first array),
    and under AMP the check that ``fit_batch`` ran its backward pass through
    ``estimator.backward``, where the losses are scaled; and what each batch's gradient is
    already divided by (``loss_divisor``: the processor's own, or a recognised loss's, see
    :mod:`.loss_divisors`; ``divides`` False for per-sample losses)."""

    def __init__(self, processor, estimator):
        self.processor, self.estimator = processor, estimator
        self._count = getattr(processor, "batch_samples", None)
        self._divisors = DivisorSource(processor, estimator)
        self.divides = self._divisors.divides
        self._divisor = None  # the last fit_batch's

    @property
    def draws_random(self):
        """Whether ``fit_batch`` draws random numbers besides the net's forward pass (see
        :mod:`hvdtrain.loop.engine.draws`): the processor's own word (``draws_random``), else
        its loss's for MXNet's or hvdtrain's ``fit_batch``; another may draw: True."""
        said = getattr(self.processor, "draws_random", None)
        if isinstance(said, bool):
            return said
        if type(self.processor).fit_batch not in _PLAIN_FIT_BATCHES:
            return True
        return blocks_draw(self.estimator.loss)

    def loss_divisor(self, batch, out):
        """What the last ``fit_batch``'s gradient is divided by (a number, or one per
        device part), None for per-sample losses."""
        return self._divisor

    def batch_samples(self, batch, batch_axis=0) -> int:
        if batch is None:  # every sample of the batch was unusable
            return 0
        return int(self._count(batch, batch_axis) if self._count is not None
                   else samples_in(batch, batch_axis))

    def fit_batch(self, estimator, batch, batch_axis=0):
        estimator.backward_calls = 0
        out = self._divisors.around(lambda: self.processor.fit_batch(estimator, batch,
                                                                     batch_axis))
        self._divisor = self._divisors.divisor(batch, out) if \
            isinstance(out, (list, tuple)) and len(out) == 4 else None
        # A batch whose divisor is 0 (no object in it) adds nothing to the step: its losses
        # may be anything (GluonCV's SSDMultiBoxLoss returns one zero per device part).
        check_output(out, self.batch_samples(batch, batch_axis),
                     f"{type(self.processor).__name__}.fit_batch",
                     counted=not self.divides or _total(self._divisor) != 0)
        if estimator.policy.amp and not estimator.backward_calls:
            raise ConfigError(f"under AMP, {type(self.processor).__name__}.fit_batch must run "
                              f"its backward pass through estimator.backward(losses), where "
                              f"the losses are scaled by AMP's loss scale (loss.backward() "
                              f"would leave the update divided by a scale never applied)")
        return out

    def evaluate_batch(self, estimator, batch, batch_axis=0, check=True):
        """The processor's ``evaluate_batch``, its output checked unless `check` is False
        (fit's pass that only settles the net's shapes: what it returns is not used, and a
        mistake is then named by ``fit_batch``'s own check at the first step)."""
        out = self.processor.evaluate_batch(estimator, batch, batch_axis)
        if check:
            check_output(out, self.batch_samples(batch, batch_axis),
                         f"{type(self.processor).__name__}.evaluate_batch")
        return out

    def epoch_figures(self, epoch: int) -> dict:
        figures = getattr(self.processor, "epoch_figures", None)
        return figures(epoch) if figures is not None else {}


def _total(divisor) -> float:
    return sum(divisor) if isinstance(divisor, list) else (divisor or 0.0)
