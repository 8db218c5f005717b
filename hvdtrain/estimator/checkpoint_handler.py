"""MXNet's ``CheckpointHandler``, distributed: every rank decides alike, rank 0 writes.

MXNet 1.9.1's handler takes three decisions in each process alone: whether the monitored
value is the best so far (``save_best``), which checkpoint to resume from and how many
epochs or batches are left (``resume_from_checkpoint``), and which old files to remove
(``max_checkpoints``). At several ranks the first leads to a collective (the save), the
others to files, so a rank must not take them alone:

- save best compares a value every rank holds alike: a validation metric is the whole
  split's after each evaluation, a training metric at an epoch's end. Inside an epoch a
  training metric is each rank's own: it is read as the whole split's so far, its sums
  reduced over the ranks and then put back as they were, so the metric goes on counting
  this rank's batches.
- resume is decided by rank 0: it finds the newest checkpoint in its ``model_dir`` and
  sends its two files' bytes to every rank, which loads them as MXNet does; the epochs and
  batches left follow from rank 0's numbers on every rank. A ``model_dir`` local to each
  node is fine. If rank 0 cannot read its checkpoint, every rank stops with one line.
- rank 0 alone writes (each file whole, every rank learning whether it could) and removes
  the files past ``max_checkpoints``.

:func:`distributed` gives this behaviour to MXNet's own handler and to a program's
subclass of it, when the Estimator's ``fit`` prepares its handlers. One thing cannot wait
for ``fit``: MXNet's constructor creates ``model_dir`` racily. hvdtrain's class makes the
folder first in its own constructor; MXNet's own class gets the same when the program
makes its Estimator (:func:`folder_race_cured`), never when hvdtrain is imported.
"""
from __future__ import annotations

import copy
import functools
import os
import tempfile

import mxnet as mx
from mxnet.gluon.contrib.estimator import event_handler as mx_handlers

from ..config import ConfigError
from ..ecosystem import MXNET_RACING_CHECKPOINT_HANDLER
from ..loop.run.together import write_together
from ..state.writes import atomic_write
from ..store.byte_exchange import broadcast_bytes
from ..store.gluon_internals import set_optimizer_states

__all__ = ["CheckpointHandler", "distributed"]


def _folder_made_first(init):
    """MXNet's ``CheckpointHandler.__init__`` (`init`) with ``model_dir`` made first, if
    missing, without a race. MXNet 1.9's checks whether the folder exists and then creates
    it: ranks sharing a new folder race, and the loser's ``makedirs`` raises
    FileExistsError (a review saw it in 101 of 400 constructions at 2 ranks)."""
    @functools.wraps(init)
    def wrapped(self, model_dir, *args, **kwargs):
        os.makedirs(model_dir, exist_ok=True)
        init(self, model_dir, *args, **kwargs)
    wrapped.hvdtrain_folder_made_first = True
    return wrapped


def folder_race_cured() -> None:
    """Give MXNet's own ``CheckpointHandler`` the race-free folder (:func:`_folder_made_first`)
    on the releases that race (:data:`hvdtrain.ecosystem.MXNET_RACING_CHECKPOINT_HANDLER`).
    Called when a program makes its Estimator: a handler is constructed in the program's own
    code, before ``fit`` can make it distributed, and a program written for MXNet's
    Estimator imports the handler from mxnet. Importing hvdtrain changes no class of MXNet's
    (tests/unit/test_ecosystem.py); a handler constructed before the Estimator races as it
    does under MXNet (hvdtrain's own :class:`CheckpointHandler` never does)."""
    mx_class = mx_handlers.CheckpointHandler
    if mx.__version__.startswith(MXNET_RACING_CHECKPOINT_HANDLER) and \
            not getattr(mx_class.__init__, "hvdtrain_folder_made_first", False):
        mx_class.__init__ = _folder_made_first(mx_class.__init__)


class CheckpointHandler(mx_handlers.CheckpointHandler):
    """MXNet's ``CheckpointHandler``: its arguments, files and names, with every decision
    taken alike on every rank and every file written by rank 0 (see the module); the folder
    made first, without MXNet's race."""

    def __init__(self, model_dir, *args, **kwargs):
        os.makedirs(model_dir, exist_ok=True)
        super().__init__(model_dir, *args, **kwargs)

    def _save_symbol(self, estimator):
        symbol_file = os.path.join(self.model_dir, self.model_prefix + "-symbol.json")

        def write():
            # Rank 0 alone reads its graph: a rank whose first batch was empty has none yet.
            if estimator.rank != 0:
                return
            graph = getattr(estimator.net, "_cached_graph", None)
            if graph:
                atomic_write(symbol_file, graph[1].save)
            else:  # MXNet's note that a net not hybridized has no symbol file
                mx_handlers.CheckpointHandler._save_symbol(self, estimator)

        write_together(estimator.dist, write, f"a CheckpointHandler save ({symbol_file})")

    def _save_params_and_trainer(self, estimator, file_prefix):
        param_file = os.path.join(self.model_dir, file_prefix + ".params")
        trainer_file = os.path.join(self.model_dir, file_prefix + ".states")
        estimator.save_model_files(param_file, trainer_file)
        if "best" not in file_prefix:
            self.saved_checkpoints.append(file_prefix)
        if len(self.saved_checkpoints) > self.max_checkpoints:
            oldest = self.saved_checkpoints.pop(0)
            if estimator.rank == 0:
                _remove(self.model_dir, oldest, estimator.logger)

    def _save_checkpoint(self, estimator):
        if not self.save_best:
            super()._save_checkpoint(estimator)
            return
        # MXNet's code reads self.monitor.get() once: it reads the agreed value instead.
        monitor = self.monitor
        self.monitor = _Value(*agreed_value(estimator, monitor))
        try:
            super()._save_checkpoint(estimator)
        finally:
            self.monitor = monitor

    def _resume_from_checkpoint(self, estimator):
        dist = estimator.dist
        if dist.num_workers == 1 or not dist.synchronous:
            # Alone, or dist_async workers that never meet: MXNet's own.
            super()._resume_from_checkpoint(estimator)
            return
        reason, epoch, batch, files = None, -1, -1, (b"", b"")
        if dist.is_root:
            try:
                epoch, batch, files = self._newest_checkpoint()
            except (OSError, ValueError) as err:
                reason = ConfigError(f"CheckpointHandler(resume_from_checkpoint=True): {err}")
        head = [epoch, batch, len(files[0]), len(files[1])] if dist.is_root else [0] * 4
        # Rank 0's reason, if it could not read, is every rank's one line.
        epoch, batch, params_size, states_size = (
            int(v) for v in dist.agree("checkpoint_handler.resume", reason, head))
        self.trained_epoch, self.trained_batch = epoch, batch
        if epoch == -1:
            estimator.logger.info("CheckpointHandler: No checkpoint found, training from "
                                  "scratch for %s", _length(estimator))
            return
        message = self._lower_length(estimator)
        params = broadcast_bytes(dist, "checkpoint_handler.files.params", files[0], params_size)
        states = broadcast_bytes(dist, "checkpoint_handler.files.states", files[1], states_size)
        _load_parameters(estimator.net, params, estimator.context)
        set_optimizer_states(estimator.trainer, states)
        mx.nd.waitall()
        if dist.is_root:  # the same line on every rank: said once
            estimator.logger.warning(message)

    def _newest_checkpoint(self):
        """Rank 0's newest checkpoint, as MXNet finds it: (epoch, batch, (the parameters'
        bytes, the trainer states' bytes)); (-1, -1, (b"", b"")) when there is none."""
        prefix = self.model_prefix + "-epoch"
        epoch = self._find_max_iteration(dir=self.model_dir, prefix=prefix, start="epoch",
                                         end="batch", saved_checkpoints=self.saved_checkpoints)
        batch = self._find_max_iteration(dir=self.model_dir, prefix=prefix + str(epoch),
                                         start="batch", end=".params")
        if epoch == -1:
            return -1, -1, (b"", b"")
        stem = os.path.join(self.model_dir, f"{self.model_prefix}-epoch{epoch}batch{batch}")
        files = []
        for path in (stem + ".params", stem + ".states"):
            if not os.path.exists(path):
                raise ValueError(f"Failed to load checkpoint, {path} does not exist")
            with open(path, "rb") as source:
                files.append(source.read())
        return epoch, batch, tuple(files)

    def _lower_length(self, estimator) -> str:
        """MXNet's checks and arithmetic of the epochs or batches left after the checkpoint
        (the same numbers on every rank: the same outcome); returns its log line."""
        msg = (f"CheckpointHandler: Checkpoint resumed from epoch {self.trained_epoch} batch "
               f"{self.trained_batch}, continue to train for ")
        if estimator.max_epoch:
            if self.trained_epoch >= estimator.max_epoch - 1:
                raise ConfigError(
                    f"Found checkpoint with maximum number of epoch {estimator.max_epoch} "
                    f"reached, please specify resume_from_checkpoint=False (default value) "
                    f"if you wan to train from scratch.")
            estimator.max_epoch = estimator.max_epoch - self.trained_epoch - 1
            msg += f"{estimator.max_epoch} epochs "
        if estimator.max_batch:
            if self.trained_batch >= estimator.max_batch - 1:
                raise ConfigError(
                    f"Found checkpoint with maximum number of batch {self.trained_batch} "
                    f"reached, please specify resume_from_checkpoint=False (default value) "
                    f"if you wan to train from scratch.")
            estimator.max_batch = estimator.max_batch - self.trained_batch - 1
            msg += f"{estimator.max_batch} batches "
        return msg


class _Value:
    """A metric's name and value, read as MXNet's handler reads its monitor (``get()``)."""

    def __init__(self, name, value):
        self.name, self.value = name, value

    def get(self):
        return self.name, self.value


def agreed_value(estimator, metric):
    """`metric`'s ``get()`` as every rank holds it alike: inside an epoch a training metric
    is read as the whole split's so far (its sums reduced over the ranks), then left as it
    was; any other is the whole split's already (reduced after each evaluation and at each
    epoch's end). Every rank calls this at the same point."""
    book = getattr(estimator, "train_book", None)
    if book is None or not book.knows(metric) or not getattr(estimator, "_inside_epoch", False):
        return metric.get()
    # The reduction sets the metrics' attributes (copying any object on the way, as
    # metrics._set does), never changes them in place: a shallow copy of each metric's
    # attributes, a composite's parts included, puts back what this rank had counted.
    metrics = {id(m): m for m in list(book.metrics) + list(getattr(book, "leaves", []))}
    held = [(m, copy.copy(vars(m))) for m in metrics.values()]
    try:
        book.reduce(estimator.dist)
        return metric.get()
    finally:
        for kept, attributes in held:
            kept.__dict__.clear()
            kept.__dict__.update(attributes)


def distributed(handler):
    """`handler` with hvdtrain's checkpoint behaviour when it is MXNet's own
    ``CheckpointHandler`` or a program's subclass of it: its class becomes hvdtrain's, or
    for a subclass one that puts hvdtrain's methods between the subclass and MXNet's (the
    subclass's own methods still run, and its ``super()`` calls reach hvdtrain's). Any
    other handler is returned as it is."""
    cls = type(handler)
    if not isinstance(handler, mx_handlers.CheckpointHandler) or \
            isinstance(handler, CheckpointHandler):
        return handler
    handler.__class__ = CheckpointHandler if cls is mx_handlers.CheckpointHandler \
        else _with_ours(cls)
    return handler


@functools.lru_cache(maxsize=None)
def _with_ours(cls):
    return type(cls.__name__, (cls, CheckpointHandler),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "__doc__": cls.__doc__})


def _length(estimator) -> str:
    return f"{estimator.max_batch} batches" if estimator.max_batch \
        else f"{estimator.max_epoch} epochs"


def _remove(model_dir, prefix, logger) -> None:
    """Rank 0 removes a checkpoint past ``max_checkpoints``: the files of `prefix` that
    :meth:`CheckpointHandler._save_params_and_trainer` wrote, by their whole names (MXNet's
    own removal matches the prefix: ``epoch0batch1`` would take ``epoch0batch10`` to
    ``19`` with it). One it cannot remove is named in a warning (raising here would end
    rank 0 alone)."""
    for name in (prefix + ".params", prefix + ".states"):
        if os.path.exists(os.path.join(model_dir, name)):
            try:
                os.remove(os.path.join(model_dir, name))
            except OSError as err:
                logger.warning("CheckpointHandler: could not remove %s: %s", name, err)


def _load_parameters(net, blob: bytes, context) -> None:
    """``net.load_parameters`` of a parameter file's bytes (MXNet 1.9.1 loads from a path
    only), so that every rank loads rank 0's file as MXNet would."""
    handle, path = tempfile.mkstemp(suffix=".params")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(blob)
        net.load_parameters(path, ctx=context)
    finally:
        os.remove(path)
