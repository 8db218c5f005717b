"""The learning rate as a pure function of the step, so a resumed run continues it."""
from __future__ import annotations

import math
from bisect import bisect_right


def effective_base_lr(lr: float, lr_scaling: str, num_workers: int) -> float:
    """`lr` after the scaling rule: ``linear`` multiplies it by the number of workers."""
    return lr * num_workers if lr_scaling == "linear" else lr


def warmup_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    """Optimizer steps of the warm-up (the first `warmup_epochs` epochs' worth)."""
    return int(round(warmup_epochs * steps_per_epoch))


def lr_at(step: int, steps_per_epoch: int, base_lr: float, warmup_epochs: float = 0.0,
          decay_epochs=(), decay_factor: float = 0.1, schedule: str = "step",
          total_steps: int = 0) -> float:
    """Learning rate for optimizer step `step` (counted from 0 over the whole run).

    Linear warm-up from ``base_lr / warmup_steps`` to `base_lr` over `warmup_epochs`, then
    ``step``: a decay by `decay_factor` at each epoch of `decay_epochs`; ``cosine``:
    ``base_lr * (1 + cos(pi * t)) / 2``; ``poly``: ``base_lr * (1 - t) ** 2``, with `t` the
    fraction of the steps after the warm-up done (reaching 0 at `total_steps`), as
    GluonCV's ``LRScheduler`` does.
    """
    warmup = warmup_steps(warmup_epochs, steps_per_epoch)
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if schedule == "step":
        epoch = step // max(steps_per_epoch, 1)
        return base_lr * decay_factor ** bisect_right(list(decay_epochs), epoch)
    done = min(1.0, (step - warmup) / max(total_steps - warmup, 1))
    if schedule == "cosine":
        return base_lr * (1 + math.cos(math.pi * done)) / 2
    if schedule == "poly":
        return base_lr * (1 - done) ** 2
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")
