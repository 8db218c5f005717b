"""Whether this run may continue a checkpoint, and what it changes when it does.

:func:`check_compatible` refuses a run that differs from the checkpoint in what cannot change
mid-run; :func:`resumed_state`, once a checkpoint is loaded, refuses a stopped epoch this run
cannot finish and applies the flags that may change (learning rate and schedule, momentum,
weight decay, batch size, worker count). :class:`~hvdtrain.state.run_dir.RunDir` calls both.
"""
from __future__ import annotations

import logging
from typing import Dict, List

from . import loss_scale
from .checkpoint_files import CheckpointError
from ..config import RunConfig, TrainConfig, model_for
from .train_state import TrainState

logger = logging.getLogger("hvdtrain")

# What a resumed run must share with its checkpoint: (flag, checkpoint config key).
FIXED = (("--model", "model"), ("--dataset", "dataset"), ("--optimizer", "optimizer"),
         ("--dtype", "dtype"), ("--amp", "amp"))
# Settings that name places or presentation, not what is trained: never reported.
UNREPORTED = ("resume", "output_dir", "progress", "tensorboard", "data_dir")


def _fixed_values(config: Dict) -> Dict[str, object]:
    values = dict(config)
    if "dataset" in values:  # the command's: the model it names, or the dataset's default
        values["model"] = model_for(values.get("model"), values.get("dataset"))
    return values


def check_compatible(path: str, meta: Dict, cfg: TrainConfig, warn: bool = True) -> None:
    """Refuse to continue checkpoint `path` with `cfg` when a fixed setting differs (one
    line naming each, with both values) or the checkpoint is past ``cfg.epochs``; with
    `warn`, say so when it has nothing left to train."""
    saved = _fixed_values(meta.get("config", {}))
    here = _fixed_values(cfg.to_dict())
    differ = [f"{flag} {here[key]} (checkpoint: {saved[key]})" for flag, key in FIXED
              if key in saved and key in here and saved[key] != here[key]]
    if differ:
        raise CheckpointError(f"cannot resume {path} with {', '.join(differ)}: these cannot "
                              f"change within a run; resume with the checkpoint's values, or "
                              f"start a new run in another --output-dir")
    epoch, partial = int(meta["epoch"]), bool(meta.get("epoch_samples"))
    if partial and saved.get("sampling", here["sampling"]) != here["sampling"]:
        # Which samples the stopped epoch already trained on depends on the split.
        raise CheckpointError(f"checkpoint {path} stopped inside an epoch with --sampling "
                              f"{saved['sampling']}: finish that epoch with the same "
                              f"--sampling (change it at an epoch boundary)")
    if partial and saved.get("accumulate", 1) != here["accumulate"]:
        # Its steps so far grouped the epoch's micro-batches by the checkpoint's count.
        raise CheckpointError(f"checkpoint {path} stopped inside an epoch with --accumulate "
                              f"{saved.get('accumulate', 1)}: finish that epoch with the same "
                              f"--accumulate (change it at an epoch boundary)")
    if epoch > cfg.epochs or (epoch == cfg.epochs and partial):
        raise CheckpointError(f"checkpoint {path} is past --epochs {cfg.epochs} (it has "
                              f"{epoch} epochs{' and part of the next' if partial else ''} "
                              f"done): give a larger --epochs to train on")
    if epoch == cfg.epochs and warn:
        logger.warning("checkpoint %s already has all %d epochs of --epochs: nothing is left "
                       "to train (give a larger --epochs to train on)", path, cfg.epochs)
    elif cfg.max_steps is not None and int(meta.get("step", 0)) >= cfg.max_steps and warn:
        logger.warning("checkpoint %s is already at step %d, --max-steps %d: nothing is left "
                       "to train (give a larger --max-steps, or drop it, to train on)", path,
                       int(meta["step"]), cfg.max_steps)


def changed_settings(meta: Dict, cfg: TrainConfig, num_workers: int) -> List[str]:
    """The settings this run changes from the checkpoint's, as ``--flag old -> new``."""
    saved = meta.get("config", {})
    fixed = {key for _, key in FIXED}
    def shown(value):
        return "unset" if value is None else value

    out = [f"--{key.replace('_', '-')} {shown(saved[key])} -> {shown(value)}"
           for key, value in cfg.to_dict().items()
           if key in saved and key not in fixed and key not in UNREPORTED and
           saved[key] != value]
    if meta.get("num_workers") not in (None, num_workers):
        out.append(f"workers {meta['num_workers']} -> {num_workers}")
    return out


def apply_settings(trainer, cfg: TrainConfig) -> None:
    """Make the optimizer loaded from a checkpoint use this run's settings.

    ``Trainer.load_states`` installs the pickled optimizer whole, with the momentum and
    weight decay the checkpoint was trained with; the learning rate is set every step."""
    optimizer = getattr(trainer, "_optimizer", None)
    if optimizer is None or not hasattr(cfg, "wd"):  # a program's own optimizer: its own
        return
    optimizer.wd = cfg.wd
    if hasattr(optimizer, "momentum"):
        optimizer.momentum = cfg.momentum


def resumed_state(path: str, meta: Dict, trainer, dist, cfg: TrainConfig, worker_batch: int,
                  train_length: int) -> TrainState:
    """The :class:`~hvdtrain.state.train_state.TrainState` training continues from after
    checkpoint `path` (metadata `meta`) was loaded into `trainer`'s parameters: refuse a
    stopped epoch this run cannot finish, then apply this run's settings and say what
    changed."""
    samples = int(meta.get("epoch_samples", 0))
    if samples >= train_length:
        raise CheckpointError(f"checkpoint {path} has {samples} samples done in its epoch, "
                              f"but the training set has {train_length}")
    if samples and cfg.sampling == "contiguous" and meta.get("num_workers") != dist.num_workers:
        raise CheckpointError(
            f"checkpoint {path} stopped inside an epoch with --sampling contiguous on "
            f"{meta.get('num_workers')} workers: resume it with {meta.get('num_workers')} "
            f"workers (contiguous parts depend on the worker count)")
    if dist.synchronous and not meta.get("has_states"):
        logger.warning("checkpoint %s holds no optimizer state (has_states is false): the "
                       "optimizer starts afresh (momentum from zero)", path)
    apply_settings(trainer, cfg)
    loss_scale.restore_loss_scale(trainer, meta)
    global_batch = cfg.global_batch(worker_batch, dist.num_workers)
    saved_batch, saved_workers = meta.get("global_batch"), meta.get("num_workers")
    saved_accumulate = int(meta.get("config", {}).get("accumulate", 1))
    # Under --elastic the world size changes by design, and each reset logs the new global
    # batch (loop/elastic/fit.py): a worker joining a running job would warn here wrongly.
    if saved_batch not in (None, global_batch) and not cfg.elastic:
        saved_per_worker = saved_batch // (saved_workers * saved_accumulate) \
            if saved_workers else "?"
        micro = (f" x {cfg.accumulate} micro-batches", f" x {saved_accumulate}") \
            if max(cfg.accumulate, saved_accumulate) > 1 else ("", "")
        logger.warning("resuming with a global batch of %d instead of %d (%d worker%s x %d%s "
                       "instead of %s x %s%s): steps per epoch change, --lr now applies to the "
                       "new global batch", global_batch, saved_batch, dist.num_workers,
                       "" if dist.num_workers == 1 else "s", worker_batch, micro[0],
                       saved_workers, saved_per_worker, micro[1])
    changes = changed_settings(meta, cfg, dist.num_workers)
    if changes:
        logger.info("resume changes: %s", ", ".join(changes))
    logger.info("resumed from %s: epoch %d, step %d%s", path, meta["epoch"], meta["step"],
                f", {samples} samples into epoch {int(meta['epoch']) + 1}" if samples else "")
    # The unusable samples the stopped epoch met before (older checkpoints: none recorded).
    skipped = int(meta.get("epoch_skipped", 0)) if samples else 0
    return TrainState(epoch=int(meta["epoch"]), step=int(meta["step"]), epoch_samples=samples,
                      epoch_skipped=skipped)
