"""How the engine (hvdtrain.loop) sees an Estimator's parts: its batch handlers around each
batch, the metric updates of an evaluation of the moving average, and its batch processor
(the sample count, the checks of what ``fit_batch`` and ``evaluate_batch`` return)."""
from __future__ import annotations

from mxnet.gluon.contrib.estimator import event_handler as mx_handlers

from ..config import ConfigError
from ..loop.engine.epoch import BatchHooks
from ..loop.engine.metrics import MetricBook
from .batch_processor import check_output, samples_in


class Handlers(BatchHooks):
    """An Estimator's batch handlers, as the engine calls them around each batch."""

    def __init__(self, estimator, batch_begin, batch_end):
        self.estimator, self.begin, self.end = estimator, batch_begin, batch_end

    def batch_begin(self, batch) -> None:
        for handler in self.begin:
            handler.batch_begin(self.estimator, batch=batch)

    def batch_end(self, batch, out) -> bool:
        _, label, pred, loss = out
        asked = [handler.batch_end(self.estimator, batch=batch, pred=pred, label=label,
                                   loss=loss) for handler in self.end]
        return any(asked)


class AverageMetrics(BatchHooks):
    """The metric updates of an evaluation of ``ema``'s average, into copies of the
    validation metrics."""

    def __init__(self, estimator, book: MetricBook):
        self.estimator, self.book = estimator, book

    def batch_end(self, batch, out) -> bool:
        _, label, pred, loss = out
        for metric in self.book.metrics:
            if isinstance(metric, mx_handlers.metric_loss):
                self.book.update(metric, 0, loss)
            else:
                self.book.update(metric, label, pred)
        return False


class Processor:
    """The Estimator's batch processor as the engine uses it: MXNet's two methods, the
    sample count (a processor without ``batch_samples`` counts its batches' first array),
    and under AMP the check that ``fit_batch`` ran its backward pass through
    ``estimator.backward``, where the losses are scaled."""

    def __init__(self, processor, estimator):
        self.processor, self.estimator = processor, estimator
        self._count = getattr(processor, "batch_samples", None)

    def batch_samples(self, batch, batch_axis=0) -> int:
        if batch is None:  # every sample of the batch was unusable
            return 0
        return int(self._count(batch, batch_axis) if self._count is not None
                   else samples_in(batch, batch_axis))

    def fit_batch(self, estimator, batch, batch_axis=0):
        estimator.backward_calls = 0
        out = self.processor.fit_batch(estimator, batch, batch_axis)
        check_output(out, self.batch_samples(batch, batch_axis),
                     f"{type(self.processor).__name__}.fit_batch")
        if estimator.policy.amp and not estimator.backward_calls:
            raise ConfigError(f"under AMP, {type(self.processor).__name__}.fit_batch must run "
                              f"its backward pass through estimator.backward(losses), where "
                              f"the losses are scaled by AMP's loss scale (loss.backward() "
                              f"would leave the update divided by a scale never applied)")
        return out

    def evaluate_batch(self, estimator, batch, batch_axis=0):
        out = self.processor.evaluate_batch(estimator, batch, batch_axis)
        check_output(out, self.batch_samples(batch, batch_axis),
                     f"{type(self.processor).__name__}.evaluate_batch")
        return out

    def epoch_figures(self, epoch: int) -> dict:
        figures = getattr(self.processor, "epoch_figures", None)
        return figures(epoch) if figures is not None else {}
