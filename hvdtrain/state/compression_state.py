"""PowerSGD's state in checkpoints, on resume and on an elastic reset.

A checkpoint of a run with ``--compression powersgd`` holds ``powersgd.npz``: each compressed
gradient's warm Q and the sum of every rank's error, by the parameter's position in the
Trainer (:meth:`~hvdtrain.store.powersgd.PowerSGD.snapshot`). The sum is all an update ever
reads of the errors, so a resume continues the same run in exact arithmetic on any number of
workers (each takes its share), and the file is one model's size whatever the world size.
Summing it is a collective: :func:`gather` runs on every rank before rank 0 writes.
"""
from __future__ import annotations

import logging
import os
from typing import Dict, Optional

import numpy as np

from .checkpoint_files import COMPRESSION, CheckpointError

logger = logging.getLogger("hvdtrain")


def compression_of(trainer):
    """The trainer's PowerSGD state, or None when it compresses nothing."""
    return getattr(trainer, "compression", None)


def gather(trainer) -> Optional[Dict[str, np.ndarray]]:
    """The arrays a checkpoint keeps of `trainer`'s compression (None without one). A
    collective when there is one: every rank calls it at the same point."""
    compression = compression_of(trainer)
    return None if compression is None else compression.snapshot()


def write(folder: str, arrays: Optional[Dict[str, np.ndarray]]) -> None:
    """Write `arrays` (from :func:`gather`) into checkpoint folder `folder`, if any."""
    if arrays is not None:
        with open(os.path.join(folder, COMPRESSION), "wb") as out:
            np.savez(out, **arrays)


def load(path: str, trainer, meta: Dict) -> None:
    """Continue `trainer`'s compression from checkpoint `path` (metadata `meta`): its Q and
    error sum when it has them, and its step count in any case (``--powersgd-start-step``
    counts the run's steps)."""
    compression = compression_of(trainer)
    file = os.path.join(path, COMPRESSION)
    if compression is None:
        if os.path.exists(file):
            logger.info("checkpoint %s holds PowerSGD's state; this run sends gradients "
                        "whole and does not use it", path)
        return
    arrays = {}
    if os.path.exists(file):
        try:
            with np.load(file) as saved:
                arrays = {name: saved[name] for name in saved.files}
        except (OSError, ValueError) as err:
            raise CheckpointError(f"checkpoint {path} is corrupt: {COMPRESSION}: "
                                  f"{err}") from None
    else:
        logger.info("checkpoint %s holds no PowerSGD state: its errors start from zero",
                    path)
    compression.load(arrays, int(meta.get("step", 0)))


def step_skipped(trainer) -> None:
    """An optimizer step that no rank had a sample for, so no exchange ran: PowerSGD counts
    it all the same, so that its count stays the run's (``--powersgd-start-step`` and a
    resume, which continues from the checkpoint's step, count the same steps)."""
    compression = compression_of(trainer)
    if compression is not None:
        compression.steps += 1


def reset(trainer, step: int) -> None:
    """An elastic reset: errors from zero, Q from its seed, at optimizer step `step`."""
    compression = compression_of(trainer)
    if compression is not None:
        compression.reset(step)
