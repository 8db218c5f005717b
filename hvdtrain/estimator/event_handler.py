"""The Estimator's event handlers: MXNet's, distributed.

The marker classes (``TrainBegin`` ... ``BatchEnd``) are MXNet's own, so a handler written
for MXNet's Estimator (a subclass of them) is one here. The standard handlers are MXNet's
classes or subclasses of them that keep their arguments and behaviour, with what a
distributed run changes:

- ``GradientUpdateHandler``: the update is the engine's (the global batch's divisor, the
  exchange, clipping, the moving average), applied before any ``batch_end`` handler runs,
  as MXNet's priority of -2000 has it; this handler marks its place and does nothing.
- ``StoppingHandler``: counts batches and epochs as MXNet's does; the engine ends the run
  at ``epochs`` or ``batches`` itself, every rank at the same step.
- ``MetricHandler``: updates the metrics as MXNet's does, keeping the exact sums that let
  the ranks reduce MAE, MSE and RMSE per element (:mod:`hvdtrain.loop.engine.metrics`).
- ``ValidationHandler``: evaluates as MXNet's does (every rank its shard, the metrics summed
  over the ranks), and the ``ema`` moving average beside the model when there is one.
- ``CheckpointHandler``: MXNet's files and names, written by rank 0 alone, each file whole or
  not at all; inside an epoch, the BatchNorm statistics it saves are averaged over the ranks.
  Its decisions are taken alike on every rank (:mod:`.checkpoint_handler`): save best on a
  value every rank shares, resume from rank 0's newest checkpoint, sent to every rank. MXNet's
  own class, and a program's subclass of it, behave so too (``fit`` gives them this
  behaviour). For a checkpoint that resumes exactly inside an epoch (the sampler's position,
  the moving average, PowerSGD's state), give the Estimator an ``output_dir`` instead.
- ``LoggingHandler`` and ``EarlyStoppingHandler`` are MXNet's: the Estimator's logger is
  quiet below WARNING on every rank but 0, and the metrics they read are the whole split's,
  the same on every rank, so early stopping is decided alike everywhere.

Batch handlers run at every step position on every rank, one where this rank's batch held
no usable sample included (:class:`~.adapters.Handlers`), so that whatever counts batches
(``ValidationHandler``'s and ``CheckpointHandler``'s ``batch_period``, a program's own
counter) counts alike on every rank.
"""
from __future__ import annotations

from mxnet.gluon.contrib.estimator import event_handler as mx_handlers
from mxnet.gluon.contrib.estimator.event_handler import (  # noqa: F401  (the API, re-exported)
    BatchBegin, BatchEnd, EarlyStoppingHandler, EpochBegin, EpochEnd, EventHandler,
    LoggingHandler, TrainBegin, TrainEnd, _check_event_handlers)
from mxnet.gluon.contrib.estimator.utils import _check_handler_metric_ref

from ..config import ConfigError
from .checkpoint_handler import CheckpointHandler, distributed


__all__ = ["TrainBegin", "TrainEnd", "EpochBegin", "EpochEnd", "BatchBegin", "BatchEnd",
           "StoppingHandler", "MetricHandler", "ValidationHandler", "LoggingHandler",
           "CheckpointHandler", "EarlyStoppingHandler", "GradientUpdateHandler"]


class StoppingHandler(mx_handlers.StoppingHandler):
    """MXNet's counters of batches and epochs; the engine itself stops at ``epochs`` or
    ``batches``, on every rank at the same step (so this handler never asks to)."""

    def batch_end(self, estimator, *args, **kwargs):
        super().batch_end(estimator, *args, **kwargs)
        return False

    def epoch_end(self, estimator, *args, **kwargs):
        super().epoch_end(estimator, *args, **kwargs)
        return False


class GradientUpdateHandler(mx_handlers.GradientUpdateHandler):
    """Where MXNet's Estimator applies the update; here the engine has already applied it,
    over the global batch, when ``batch_end`` handlers run."""

    def batch_end(self, estimator, *args, **kwargs):
        return False


class MetricHandler(mx_handlers.MetricHandler):
    """MXNet's: reset at each epoch's beginning, updated at each batch's end (a ``Loss``
    metric with the losses); through the Estimator, which also keeps the exact sums of MAE,
    MSE and RMSE that the ranks reduce."""

    def epoch_begin(self, estimator, *args, **kwargs):
        for metric in self.metrics:
            estimator.reset_metric(metric)

    def batch_end(self, estimator, *args, **kwargs):
        for metric in self.metrics:
            if isinstance(metric, mx_handlers.metric_loss):
                estimator.update_metric(metric, 0, kwargs["loss"])
            else:
                estimator.update_metric(metric, kwargs["label"], kwargs["pred"])


class ValidationHandler(mx_handlers.ValidationHandler):
    """MXNet's, and then the ``ema`` average evaluated beside the model when there is one
    (its metrics are named ``ema <name>``)."""

    def batch_end(self, estimator, *args, **kwargs):
        self.current_batch += 1
        if self.batch_period and self.current_batch % self.batch_period == 0:
            self._validate(estimator)

    def epoch_end(self, estimator, *args, **kwargs):
        self.current_epoch += 1
        if self.epoch_period and self.current_epoch % self.epoch_period == 0:
            self._validate(estimator)

    def _validate(self, estimator):
        self.eval_fn(val_data=self.val_data, batch_axis=estimator.batch_axis,
                     event_handlers=self.event_handlers)
        evaluate_average = getattr(estimator, "evaluate_average", None)
        if evaluate_average is not None:
            evaluate_average(self.val_data, estimator.batch_axis)


def fit_handlers(estimator, val_data, event_handlers) -> list:
    """The handlers of a ``fit``: `event_handlers` and MXNet's defaults for what they leave
    out (the counters, the update's place, the metric updates, the validation, the log),
    in MXNet's order of priority. A handler that applies the update itself is refused: the
    engine has applied it, over the global batch, when ``batch_end`` handlers run. MXNet's
    own ``CheckpointHandler`` (or a subclass) is given hvdtrain's behaviour: written by rank
    0, decided alike on every rank."""
    event_handlers = [distributed(handler) for handler in _check_event_handlers(event_handlers)]
    for handler in event_handlers:
        if isinstance(handler, mx_handlers.GradientUpdateHandler) and \
                type(handler).batch_end is not GradientUpdateHandler.batch_end:
            raise ConfigError(
                f"{type(handler).__name__}: hvdtrain's engine applies the update (over the "
                f"global batch, after the exchange); a handler cannot apply it again: drop "
                f"it, and use the Estimator's clip_grad_norm, ema or a batch processor for "
                f"what it did")
    added = [StoppingHandler(estimator.max_epoch, estimator.max_batch)]
    if not _has(event_handlers, mx_handlers.GradientUpdateHandler):
        added.append(GradientUpdateHandler())
    if not _has(event_handlers, mx_handlers.MetricHandler):
        added.append(MetricHandler(metrics=estimator.train_metrics))
    if not _has(event_handlers, mx_handlers.ValidationHandler) and val_data:
        added.append(ValidationHandler(val_data=val_data, eval_fn=estimator.evaluate))
    if not _has(event_handlers, mx_handlers.LoggingHandler):
        added.append(LoggingHandler(metrics=estimator.train_metrics))
    return _completed(event_handlers, added,
                      set(estimator.train_metrics + estimator.val_metrics))


def evaluate_handlers(estimator, event_handlers) -> list:
    """The handlers of an ``evaluate``: `event_handlers`, and MXNet's metric updates and
    log where they leave them out."""
    event_handlers = _check_event_handlers(event_handlers)
    added = []
    if not _has(event_handlers, mx_handlers.MetricHandler):
        added.append(MetricHandler(metrics=estimator.val_metrics))
    if not _has(event_handlers, mx_handlers.LoggingHandler):
        added.append(LoggingHandler(metrics=estimator.val_metrics))
    return _completed(event_handlers, added, set(estimator.val_metrics))


def _has(handlers, kind) -> bool:
    return any(isinstance(handler, kind) for handler in handlers)


def _completed(given: list, added: list, known: set) -> list:
    """`given` and `added` in MXNet's order of priority; when both have some, every handler
    must read the Estimator's own metric objects (`known`), as MXNet checks."""
    mixing = given and added
    handlers = given + added
    if mixing:
        for handler in handlers:
            _check_handler_metric_ref(handler, known)
    handlers.sort(key=lambda handler: getattr(handler, "priority", 0))
    return handlers
