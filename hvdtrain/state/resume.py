"""Resuming a run: which checkpoint, whether this run may continue it, and loading it.

``--resume`` names checkpoints best first (:func:`resolve_resume`); :func:`check_compatible`
refuses, before anything is written, a run that differs from the checkpoint in what cannot
change mid-run; :func:`resume_state` loads the first checkpoint that loads (passing over
damaged ones with a warning), makes the ranks agree on it and applies the flags that may
change (learning rate and schedule, momentum, weight decay, batch size, worker count).
"""
from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional

import mxnet as mx

from . import loss_scale
from .checkpoint import CheckpointError, read_meta
from ..config import TrainConfig, model_for
from .train_state import TrainState
from .resume_from import latest_checkpoint, loadable, resolve_resume, restore  # noqa: F401

logger = logging.getLogger("hvdtrain")

# What a resumed run must share with its checkpoint: (flag, checkpoint config key).
FIXED = (("--model", "model"), ("--dataset", "dataset"), ("--optimizer", "optimizer"),
         ("--dtype", "dtype"), ("--amp", "amp"))
# Settings that name places or presentation, not what is trained: never reported.
UNREPORTED = ("resume", "output_dir", "progress", "tensorboard", "data_dir")


def _fixed_values(config: Dict) -> Dict[str, object]:
    values = dict(config)
    values["model"] = model_for(values.get("model"), values.get("dataset"))
    return values


def check_compatible(path: str, meta: Dict, cfg: TrainConfig, warn: bool = True) -> None:
    """Refuse to continue checkpoint `path` with `cfg` when a fixed setting differs (one
    line naming each, with both values) or the checkpoint is past ``cfg.epochs``; with
    `warn`, say so when it has nothing left to train."""
    saved = _fixed_values(meta.get("config", {}))
    here = _fixed_values(cfg.to_dict())
    differ = [f"{flag} {here[key]} (checkpoint: {saved[key]})" for flag, key in FIXED
              if key in saved and saved[key] != here[key]]
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
    if epoch > cfg.epochs or (epoch == cfg.epochs and partial):
        raise CheckpointError(f"checkpoint {path} is past --epochs {cfg.epochs} (it has "
                              f"{epoch} epochs{' and part of the next' if partial else ''} "
                              f"done): give a larger --epochs to train on")
    if epoch == cfg.epochs and warn:
        logger.warning("checkpoint %s already has all %d epochs of --epochs: nothing is left "
                       "to train (give a larger --epochs to train on)", path, cfg.epochs)


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
    if optimizer is None:
        return
    optimizer.wd = cfg.wd
    if hasattr(optimizer, "momentum"):
        optimizer.momentum = cfg.momentum


def resume_state(candidates: List[str], net, trainer, devices, dist, cfg: TrainConfig,
                 worker_batch: int, train_length: int):
    """Load the first of `candidates` (best first) that loads, and return the
    :class:`~hvdtrain.state.train_state.TrainState` training continues from.

    Every rank loads the same files (the checkpoint must be visible to all of them). A
    damaged checkpoint is passed over with a warning when an older one remains; the ranks
    then check, with one collective, that they continue from the same position, since a
    rank that loaded another would meet the others at a different step and hang.
    """
    path, meta = _restore_first(candidates, net, trainer, devices, cfg)
    position = [int(meta["epoch"]) + 1, int(meta["step"]), int(meta.get("epoch_samples", 0))] \
        if path else [0, 0, 0]
    agree_on_position(dist, position, path)
    if not path:
        logger.info("no checkpoint to resume from: starting fresh")
        return TrainState()
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
    global_batch = worker_batch * dist.num_workers
    saved_batch, saved_workers = meta.get("global_batch"), meta.get("num_workers")
    if saved_batch not in (None, global_batch):
        saved_per_worker = saved_batch // saved_workers if saved_workers else "?"
        logger.warning("resuming with a global batch of %d instead of %d (%d worker%s x %d "
                       "instead of %s x %s): steps per epoch change, --lr now applies to the "
                       "new global batch", global_batch, saved_batch, dist.num_workers,
                       "" if dist.num_workers == 1 else "s", worker_batch, saved_workers,
                       saved_per_worker)
    changes = changed_settings(meta, cfg, dist.num_workers)
    if changes:
        logger.info("resume changes: %s", ", ".join(changes))
    logger.info("resumed from %s: epoch %d, step %d%s", path, meta["epoch"], meta["step"],
                f", {samples} samples into epoch {int(meta['epoch']) + 1}" if samples else "")
    return TrainState(epoch=int(meta["epoch"]), step=int(meta["step"]), epoch_samples=samples)


def _restore_first(candidates, net, trainer, devices, cfg):
    """(path, meta) of the first candidate that loads, or (None, None) for none."""
    for index, path in enumerate(candidates):
        meta = read_meta(path)
        check_compatible(path, meta, cfg, warn=False)
        try:
            restore(path, net, trainer, devices)
            if index:
                logger.warning("resuming from %s, the newest checkpoint that loads",
                               path)
            return path, meta
        except CheckpointError as err:
            if index == len(candidates) - 1:
                if index:
                    raise CheckpointError(f"{err} (and no older checkpoint loads either)") \
                        from None
                raise
            logger.warning("%s; falling back to an older checkpoint", err)
    return None, None


def agree_on_position(dist, position: List[int], path: Optional[str]) -> None:
    """Check that every rank continues from the same `position` (epoch + 1, step, samples).

    Asynchronous stores (``dist_async``) have no collective to compare with: the check is
    skipped, and said so, since every worker read the same folder by the same rules."""
    if dist.num_workers == 1:
        return
    if not dist.synchronous:
        logger.info("dist_async: the workers cannot compare which checkpoint each found (an "
                    "asynchronous store has no collective); each read %s by the same rules",
                    path or "no checkpoint")
        return
    total = dist.sum_across_workers("resume_check", mx.nd.array(position))
    if [int(v) for v in total.asnumpy()] != [v * dist.num_workers for v in position]:
        raise CheckpointError(f"ranks found different checkpoints to resume from (this rank: "
                              f"{path or 'none'}); is the output folder shared by all ranks?")
