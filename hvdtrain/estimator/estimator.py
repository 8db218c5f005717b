"""``hvdtrain.Estimator``: MXNet's Estimator, distributed, with every guarantee of a run.

Code written for MXNet 1.9.1's ``gluon.contrib.estimator`` runs here with its import changed
to ``hvdtrain.estimator``: the same constructor, ``fit``, ``evaluate``, batch processors and
event handlers. What changes is what a distributed run needs (docs/estimator.md):

- the data (a Gluon ``Dataset`` or ``DataLoader``) is resharded: each rank takes its share
  of every epoch, padded to equal steps, every validation sample scored once;
- a Trainer made as MXNet's examples make it (no store) is made to train on the run's store,
  in gradient buckets; each step divides the gradients summed over every rank by the
  global batch, the same number on every rank;
- the metrics are reduced over the ranks before any handler reads them at an epoch's end
  (each kind's state as :mod:`~hvdtrain.loop.engine.metric_states` says: counts, arrays,
  records; :func:`register_metric_state` for a metric of your own), so logs, checkpoints
  and early stopping see the whole split's figures on every rank;
- rank 0 logs and writes; every rank's arrays are the same, BatchNorm's statistics included;
- and everything a run of the ``hvdtrain`` command has: checkpoints with exact resume
  (``output_dir``, ``resume``), stop signals, elastic training, accumulation, the fp16
  wire, PowerSGD, AMP, the moving average, clipping, the stall watchdog and the finite
  check, set by :class:`~hvdtrain.config.RunConfig`'s fields as keyword arguments.
"""
from __future__ import annotations

import copy
import logging
import math
from typing import Dict, Optional

from mxnet.gluon.contrib.estimator import estimator as mx_estimator
from mxnet.gluon.contrib.estimator.utils import _check_metrics

from ..config import ConfigError
from ..loop.engine.evaluate import evaluate
from ..loop.engine.metric_states import MetricState, flat_metrics, register_metric_state
from ..loop.engine.metrics import TRAIN_FIELDS, VAL_FIELDS, MetricBook
from ..loop.engine.precision import Precision
from ..loop.engine.schedule import effective_base_lr
from ..loop.engine.trainer import broadcast_parameters, distributed_trainer
from ..loop.recipe.ema import FINAL_EMA_PARAMS, WeightAverage
from ..loop.run.fit import RunHooks, RunParts, fit as run_fit
from ..loop.run.outputs import build_outputs
from ..loop.run.replica_check import ReplicaCheck
from ..loop.run.together import StoppedTogether
from ..report.log import error_line, setup_logging
from ..state.run_dir import RunDir
from ..state.train_state import TrainState
from ..store.gluon_internals import shape_deferred, skip_first_step_broadcast
from .adapters import AverageMetrics, Handlers, Processor
from .batch_processor import BatchProcessor
from .checkpoint_handler import folder_race_cured
from .event_handler import evaluate_handlers, fit_handlers
from .errors import in_program, keyword_errors, one_line_errors
from .feeds import Feeds, split_size
from .saves import averaged_statistics, save_final, save_model_files, settle_shapes
from .setup import (Setup, check_store_for_devices, default_context, dist_for, guards,
                    run_config)

logger = logging.getLogger("hvdtrain")

__all__ = ["Estimator", "MetricState", "register_metric_state"]


class Estimator(mx_estimator.Estimator, RunHooks):
    """MXNet's Estimator for a distributed run (see the module).

    Parameters
    ----------
    net, loss, train_metrics, val_metrics, initializer, trainer, context, val_net, val_loss, batch_processor
        As MXNet 1.9.1's ``Estimator``; `context` defaults to this rank's GPU (its local
        rank among the GPUs it sees), else the CPU; `batch_processor` to hvdtrain's
        :class:`~hvdtrain.estimator.batch_processor.BatchProcessor`.
    config : RunConfig, optional
        The run's settings; RunConfig's fields may also be given as keyword arguments
        (``output_dir="runs/a"``, ``resume="auto"``, ``accumulate=2``, ``ema=0.999``,
        ``compression="powersgd"``, ...), which override `config`'s.
    store : KVStore, optional
        The store that reduces gradients (default: made as the settings say: Horovod's
        ``horovod`` store, created here, ``hvd.init()`` included).
    setup : Setup, optional
        What a program that set part of the run up itself hands over (the command).
    """

    @keyword_errors
    def __init__(self, net, loss, train_metrics=None, val_metrics=None, initializer=None,
                 trainer=None, context=None, val_net=None, val_loss=None,
                 batch_processor=None, *, config=None, store=None, setup: Setup = None,
                 **options):
        self.setup = setup or Setup()
        if not self.setup.command:  # the command makes its one lines itself
            one_line_errors()
        folder_race_cured()  # MXNet's CheckpointHandler, constructed by the program next
        self.config, self._given = run_config(config, options, self.setup.command)
        # What MXNet's Estimator refuses (its ValueErrors, as ConfigErrors: one line for an
        # uncaught one), refused before a store is made (hvd.init()).
        try:
            self._check_loss(loss)
            if val_loss is not None:
                self._check_loss(val_loss)
            _check_metrics(train_metrics)
            _check_metrics(val_metrics)
            self._check_batch_processor(batch_processor)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.dist = self.setup.dist or dist_for(self.config, store)
        self.policy = Precision(getattr(self.config, "dtype", "float32"), self.config.amp)
        # A composite's metrics are the Estimator's (MXNet flattens one given alone).
        super().__init__(net, loss, flat_metrics(train_metrics), flat_metrics(val_metrics),
                         initializer, trainer,
                         context or default_context(self.dist), val_net, val_loss,
                         batch_processor or BatchProcessor())
        # Rank 0 logs; warnings and errors come from every rank.
        self.logger.setLevel(logging.INFO if self.dist.is_root else logging.WARNING)
        self.policy.check_devices(self.context)
        check_store_for_devices(self.config.kvstore, self.dist, self.context)
        # Each metric's state checked (refused in one line if the ranks cannot reduce it).
        strided = self.config.sampling == "strided"  # records kept in sample order
        self.train_book = MetricBook(self.train_metrics, "training_metrics", TRAIN_FIELDS,
                                     strided)
        self.val_book = MetricBook(self.val_metrics, "validation_metrics", VAL_FIELDS,
                                   strided)
        self.trainer = distributed_trainer(self.trainer, self.net, self.config, self.dist,
                                           self.policy.amp)
        if self.policy.amp:
            self.policy.prepare_trainer(self.trainer)
        self.processor = Processor(self.batch_processor, self)
        # The rate a schedule follows (scaled by the workers with lr_scaling='linear').
        self._rate = self.setup.base_lr if self.setup.base_lr is not None \
            else self.trainer.learning_rate
        self.state = TrainState()
        self.max_epoch = self.max_batch = None
        self.batch_axis = 0
        self.backward_calls = 0
        self.result: Dict = {}
        self.val_count: Optional[int] = None
        self.feeds = Feeds()
        self._evaluated = False
        self._average: Dict = {}
        self._ema: Optional[WeightAverage] = None
        self._inside_epoch = False
        self._handlers = None
        self._watchdog = None  # the run's, while fit runs
        self._replicas: Optional[ReplicaCheck] = None  # the run's, once fit has begun

    # --- who and where -------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def num_workers(self) -> int:
        return self.dist.num_workers

    @property
    def ema(self) -> Optional[WeightAverage]:
        """``ema``'s moving average of the model (None without it, or before ``fit``)."""
        return self._ema

    def backward(self, losses) -> None:
        """The backward pass of `losses` (an NDArray or a list of them), through AMP's loss
        scaling when it is on: what a batch processor's ``fit_batch`` calls."""
        self.backward_calls += 1
        self.policy.backward(losses if isinstance(losses, (list, tuple)) else [losses],
                             self.trainer)

    # --- the handlers --------------------------------------------------------------------

    def _prepare_default_handlers(self, val_data, event_handlers):
        return fit_handlers(self, val_data, event_handlers)

    def _prepare_default_validation_handlers(self, event_handlers):
        return evaluate_handlers(self, event_handlers)

    def _book_of(self, metric) -> Optional[MetricBook]:
        for book in (self.train_book, self.val_book):
            if book.knows(metric):
                return book
        return None

    def update_metric(self, metric, labels, preds) -> None:
        """``metric.update(labels, preds)`` (a metric keeps what its reduction over the
        ranks needs by its own update: :mod:`hvdtrain.loop.engine.metric_states`)."""
        if isinstance(preds, (list, tuple)) and not preds:
            return  # a step position where this rank had no sample (MXNet's F1 would count it)
        book = self._book_of(metric)
        if book is None:
            metric.update(labels, preds)
        else:
            book.update(metric, labels, preds)

    def reset_metric(self, metric) -> None:
        book = self._book_of(metric)
        if book is None:
            metric.reset()
        else:
            book.reset_one(metric)

    # --- fit -----------------------------------------------------------------------------

    @keyword_errors
    def fit(self, train_data, val_data=None, epochs=None, event_handlers=None, batches=None,
            batch_axis=0):
        """Train on `train_data` (a Gluon Dataset or DataLoader) for `epochs` epochs in all
        (epochs a resumed checkpoint holds included) or `batches` optimizer steps,
        evaluating on `val_data` after each epoch, as MXNet's ``Estimator.fit`` (with
        ``accumulate`` > 1, `batches` counts optimizer steps). Every rank calls it alike;
        the figures every rank ends with are in :attr:`result`."""
        cfg, train_feed = self.prepare(train_data, val_data, epochs, event_handlers, batches,
                                       batch_axis)
        try:
            with guards(cfg, self.dist, self.setup) as (watchdog, signals):
                self._watchdog = watchdog
                try:
                    self._fit(cfg, train_feed, watchdog, signals)
                finally:
                    self._watchdog = None
        except StoppedTogether as stop:
            self._leave(stop)

    def _leave(self, stop: StoppedTogether) -> None:
        """Every rank stopped at the same point (a stop asked for, its checkpoint saved;
        rank 0's failed write; replicas that differ under replica_check='strict'): each
        says its one line, they leave together, and the process ends with the status a
        scheduler reads (75: run it again). The line names the program's keywords
        (resume='auto'), not the command's flags; the command makes its exit itself."""
        if self.setup.command:
            raise stop
        if stop.line:
            error_line(in_program(stop.line))
        stop.leave()
        raise SystemExit(stop.status) from None

    def prepare(self, train_data, val_data=None, epochs=None, event_handlers=None,
                batches=None, batch_axis=0):
        """What :meth:`fit` does before it trains: the arguments checked, the data split
        over the ranks, the handlers ready. Returns (the run's settings, the training
        split's feed)."""
        if (not epochs) == (not batches):
            raise ValueError("Fit only support exactly one type of iteration, train by number "
                             "of epochs or number of batches.Please specify one and only one "
                             "of: epochs or batches.")
        train_feed = self.feeds.of(train_data, True, self.dist, self.config)
        if val_data is not None:
            self.feeds.of(val_data, False, self.dist, self.config)
        self.max_epoch, self.max_batch, self.batch_axis = epochs, batches, batch_axis
        handlers = self._prepare_default_handlers(val_data, event_handlers)
        self._handlers = self._categorize_handlers(handlers)
        steps_per_epoch = max(1, -(-len(train_feed) // self.config.accumulate))
        cfg = self.config.replace(
            epochs=epochs or max(1, math.ceil(batches / steps_per_epoch)),
            max_steps=batches if batches else self.config.max_steps)
        if not self.setup.command:
            # A DataLoader's own batch size is the one trained with: a batch_size set beside
            # it would be ignored, so it must agree; the records say the real one.
            if "batch_size" in self._given and cfg.batch_size != train_feed.batch_size:
                raise ConfigError(f"batch_size={cfg.batch_size}, but the DataLoader given to "
                                  f"fit has batch_size={train_feed.batch_size}, the one "
                                  f"trained with: drop batch_size (it batches a Dataset "
                                  f"given without a loader)")
            cfg = cfg.replace(batch_size=train_feed.batch_size)
        return cfg, train_feed

    def _fit(self, cfg, train_feed, watchdog, signals) -> None:
        """The run, inside fit's guards: the folder, the restore, the claim and the
        broadcast, the epochs, the final save."""
        run_dir = self.setup.run_dir or RunDir.decide(cfg)
        settle_shapes(self, train_feed)
        worker_batch = train_feed.batch_size
        if cfg.elastic:
            # Loading a checkpoint's optimizer states would make the trainer broadcast
            # its parameters first: a collective that a worker joining a running job
            # would make alone, and hang. The elastic loop's sync broadcasts them.
            skip_first_step_broadcast(self.trainer)
        state = run_dir.restore(self.net, self.trainer, self.context, self.dist,
                                worker_batch, split_size(train_feed))
        self.state = state
        if self.setup.epoch_begin is not None:
            # Before the store is set up, so that its buckets are planned for the epoch
            # training starts in (the command's frozen epochs).
            self.setup.epoch_begin(state.epoch)
        watchdog.beat("start-up (trainer ready)")
        if cfg.elastic:
            try:
                self.result = self._fit_elastic(cfg, train_feed, state, run_dir,
                                                watchdog, signals)
            finally:
                run_dir.release()
            return
        with run_dir.claim(self.dist):
            broadcast_parameters(self.trainer, worker_batch * self.dist.num_workers
                                 if self.dist.synchronous else worker_batch)
            watchdog.beat("start-up (parameters broadcast)")
            self._ema = self._moving_average(cfg, run_dir)
            outputs = build_outputs(cfg, self.dist, worker_batch, self._meta(),
                                    self._final_names(cfg))
            self.result = run_fit(self._run_parts(cfg, train_feed, outputs, state,
                                                  watchdog, signals))
            save_final(cfg, self.net, self.dist, self._ema, self.setup.final_files,
                       watchdog)

    def _fit_elastic(self, cfg, train_feed, state, run_dir, watchdog, signals) -> Dict:
        """:meth:`fit` under Horovod's elastic driver (loop/elastic/fit.py)."""
        # Imported here: Horovod's elastic module loads Horovod, and `import hvdtrain` must
        # work on a host where it does not load (hvdtrain-check names such a rank).
        from ..loop.elastic.fit import fit_elastic  # pylint: disable=import-outside-toplevel
        worker_batch = train_feed.batch_size
        self._ema = self._moving_average(cfg, run_dir)  # the elastic sync makes rank 0's everyone's

        def make_run(dist, position, commit):
            self.dist = dist
            self.logger.setLevel(logging.INFO if dist.is_root else logging.WARNING)
            self.feeds.reshard(dist)
            outputs = build_outputs(cfg, dist, worker_batch, self._meta(),
                                    self._final_names(cfg))
            parts = self._run_parts(cfg, train_feed, outputs, position, watchdog, signals)
            parts.commit = commit
            return parts

        def finish(dist):
            self.dist = dist
            save_final(cfg, self.net, self.dist, self._ema, self.setup.final_files,
                       watchdog)

        dist, result = fit_elastic(self.net, self.trainer, self.dist.store, cfg, state,
                                   run_dir, watchdog, make_run, finish, self._ema)
        self.dist = dist
        return result

    def _run_parts(self, cfg, train_feed, outputs, state, watchdog, signals) -> RunParts:
        self.state = state
        describe = self.setup.describe or f"{type(self.net).__name__}"
        self._replicas = ReplicaCheck(self.net, self.trainer, self.dist, cfg.replica_check,
                                      lambda fields: outputs.metrics.write("replicas", **fields))
        return RunParts(self.net, self.trainer, self.context, self.dist, cfg, train_feed,
                        self, self.train_book, outputs, state, watchdog, self.policy, signals,
                        self._ema, base_lr=self._base_lr(cfg), prefixes=self.setup.prefixes,
                        batch_axis=self.batch_axis, describe=describe,
                        replicas=self._replicas)

    def _base_lr(self, cfg) -> Optional[float]:
        """The rate the schedule follows at this world size: the command's, or the
        optimizer's own (as it was when the Estimator was made) when the settings ask for a
        schedule; else None, and the trainer's rate is left to the program and its handlers
        (an optimizer's own ``lr_scheduler`` keeps working)."""
        scheduled = cfg.warmup_epochs or cfg.lr_decay_epochs or cfg.lr_schedule != "step" \
            or cfg.lr_scaling != "none"
        if self.setup.base_lr is None and not scheduled:
            return None
        return effective_base_lr(self._rate, cfg.lr_scaling, self.dist.num_workers)

    def _meta(self) -> Dict:
        return dict({"model": type(self.net).__name__}, **self.setup.meta)

    def _final_names(self, cfg) -> tuple:
        return tuple(self.setup.final_files) + \
            ((FINAL_EMA_PARAMS,) if cfg.ema is not None else ()) + ("model.params",)

    def _moving_average(self, cfg, run_dir) -> Optional[WeightAverage]:
        """``ema``'s average: of the model as it is now, or the resumed checkpoint's."""
        ema = WeightAverage.of(cfg, self.net)
        if ema is not None and run_dir.resumed_from:
            ema.resume(run_dir.resumed_from)
        return ema

    # --- RunHooks: what the run asks at each point ---------------------------------------

    @property
    def batch_hooks(self):
        _, _, batch_begin, batch_end, _, _ = self._handlers
        return Handlers(self, batch_begin, batch_end)

    @property
    def val_feed(self):
        return self.feeds.validation

    def train_begin(self) -> None:
        for handler in self._handlers[0]:
            handler.train_begin(self)

    def epochs_after_begin(self, epochs: int, state: TrainState) -> int:
        # MXNet's CheckpointHandler resumes from files of its own at train_begin and lowers
        # max_epoch to the epochs left: then this call trains that many more.
        if self.max_epoch and self.max_epoch != epochs:
            return state.epoch + self.max_epoch
        return epochs

    def epoch_begin(self) -> None:
        if self.setup.epoch_begin is not None:
            self.setup.epoch_begin(self.state.epoch)
        self._evaluated, self._average = False, {}
        self._inside_epoch = True
        for handler in self._handlers[1]:
            handler.epoch_begin(self)

    def epoch_end(self) -> bool:
        self._inside_epoch = False
        return any([handler.epoch_end(self) for handler in self._handlers[4]])

    def train_end(self) -> None:
        for handler in self._handlers[5]:
            handler.train_end(self)

    def validation(self, evaluated: bool) -> Dict[str, Optional[float]]:
        val = self.setup.prefixes[1]
        names = self.val_book.names()
        if not (evaluated and self._evaluated):
            if self.val_feed is None:
                return {}
            return dict({f"{val}_{n}": None for n in names}, **{f"{val}_samples": None})
        return dict({f"{val}_{n}": v for n, v in self.val_book.values().items()},
                    **{f"{val}_samples": self.val_count})

    def average_validation(self) -> Dict[str, Optional[float]]:
        return dict(self._average)

    def epoch_figures(self, epoch: int) -> dict:
        return self.processor.epoch_figures(epoch)

    # --- evaluate ------------------------------------------------------------------------

    def evaluate(self, val_data, batch_axis=0, event_handlers=None):
        """Score `val_data` (a Gluon Dataset or DataLoader: every sample once over the
        ranks) with the validation net, loss and metrics, the metrics summed over the ranks
        before the ``epoch_end`` handlers read them; as MXNet's ``Estimator.evaluate``. How
        many samples were scored, over every rank, is :attr:`val_count`."""
        feed = self.feeds.of(val_data, False, self.dist, self.config)
        if self._watchdog is None:  # outside fit, nothing has made the ranks' models one
            if not logging.getLogger("hvdtrain").handlers:  # the program's own, else ours
                setup_logging(self.dist.rank)
            try:
                self._one_model(feed, batch_axis)
            except StoppedTogether as stop:
                self._leave(stop)
        for metric in self.val_metrics:
            self.reset_metric(metric)
        handlers = self._prepare_default_validation_handlers(event_handlers)
        _, epoch_begin, batch_begin, batch_end, epoch_end, _ = \
            self._categorize_handlers(handlers)
        for handler in epoch_begin:
            handler.epoch_begin(self)
        feed.sampler.set_epoch(self.state.epoch)  # the same order; names the epoch it scores
        epoch, watchdog = self.state.epoch, self._watchdog
        with averaged_statistics(self.net, self.dist, self._inside_epoch):
            self.val_count = evaluate(
                self, self.processor, feed, self.dist, self.val_book,
                Handlers(self, batch_begin, batch_end), batch_axis,
                on_batch=None if watchdog is None else
                lambda b: watchdog.beat(f"evaluation batch {b} (epoch {epoch + 1})"))
        self._evaluated = True
        for handler in epoch_end:
            handler.epoch_end(self)

    def _one_model(self, feed, batch_axis) -> None:
        """Before an ``evaluate`` outside ``fit``: every rank scores one model. The ranks
        may hold different weights (each initialised its own; no start-up broadcast ran),
        so they are compared as at an epoch's end (shapes Gluon defers settled first by one
        validation batch); what differs is rank 0's from then on, as ``replica_check``
        says (docs/estimator.md). A rank that cannot settle them says why to every rank
        (the replica check is a collective: refusing alone, it would leave the others
        there)."""
        with self.dist.agreement("evaluate_usable"):
            if any(shape_deferred(p) for p in self.net.collect_params().values()):
                feed.sampler.set_epoch(self.state.epoch)
                batch = next((b for b in feed if self.processor.batch_samples(
                    b, batch_axis)), None)
                # Every rank runs the pass (a rank with no sample in its shard would not
                # know the shapes): a shard of nothing scores nothing, and says so below.
                if batch is not None:
                    self.processor.evaluate_batch(self, batch, batch_axis)
                elif any(shape_deferred(p) for p in self.net.collect_params().values()):
                    raise ConfigError("evaluate(): this rank's share of the data holds no "
                                      "usable sample, and the net's shapes are not known yet: "
                                      "run one batch through the net (or load its "
                                      "parameters) first")
        ReplicaCheck(self.net, self.trainer, self.dist, self.config.replica_check).verify(
            "evaluate() before scoring")

    def evaluate_average(self, val_data, batch_axis=0) -> None:
        """With ``ema`` on: `val_data` scored again with the moving average in the model,
        into copies of the validation metrics (named "ema ..."; the record's fields
        ``ema_<val>_<name>``)."""
        if self._ema is None:
            return
        feed = self.feeds.of(val_data, False, self.dist, self.config)
        metrics = [copy.deepcopy(m) for m in self.val_metrics]
        for metric in metrics:
            metric.name = "ema " + metric.name
        book = MetricBook(metrics, "average_validation_metrics", VAL_FIELDS,
                          self.config.sampling == "strided")
        book.reset()
        feed.sampler.set_epoch(self.state.epoch)
        epoch, watchdog = self.state.epoch, self._watchdog
        with self._ema.applied():
            count = evaluate(self, self.processor, feed, self.dist, book,
                             AverageMetrics(self, book), batch_axis,
                             on_batch=None if watchdog is None else lambda b: watchdog.beat(
                                 f"evaluation batch {b} of the average (epoch {epoch + 1})"))
        val = self.setup.prefixes[1]
        self._average = dict({f"ema_{val}_{n}": v for n, v in book.values().items()},
                             **{f"ema_{val}_samples": count})

    def save_model_files(self, param_file: str, trainer_file: str) -> None:
        """A CheckpointHandler's save (:func:`~.saves.save_model_files`), after the ranks
        compared their arrays (an epoch's end compared them already)."""
        if self._replicas is not None and self._inside_epoch:
            self._replicas.verify(f"a CheckpointHandler save ({param_file})", statistics=False,
                                  state=self.state)
        save_model_files(self.net, self.trainer, self.dist, self._inside_epoch, param_file,
                         trainer_file)
