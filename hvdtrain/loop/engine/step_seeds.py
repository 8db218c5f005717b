"""MXNet's random numbers drawn from (seed, rank, step, device): a resumed step draws what
the uninterrupted one drew.

A forward pass in training mode draws from MXNet's generator (Dropout's masks, a random
augmentation on the device); a checkpoint cannot hold that generator's state (MXNet 1.9.1
has no call that reads it). So before each optimizer step every device's generator is seeded
from the run's seed, the rank, the step and the device: a run resumed at step S draws at
step S what a run never stopped drew there, and the resume is bit-exact with dropout too.
The cost is one ``mx.random.seed`` per device and step: 0.4-1.3 ms on a 2-core CPU host
(docs/reliability.md, "Resume").
"""
from __future__ import annotations

from typing import Sequence

import mxnet as mx
import numpy as np


def step_seed(seed: int, rank: int, step: int, device: int) -> int:
    """The seed of `device` (its position among the rank's devices) for optimizer step
    `step` (counted from 0 over the run) on `rank`: 31 bits, well spread."""
    return int(np.random.SeedSequence([seed, rank, step, device]).generate_state(1)[0]
               >> 1)


def seed_step(seed: int, rank: int, step: int, devices: Sequence) -> None:
    """Seed every one of `devices` for step `step` (see the module)."""
    for index, device in enumerate(devices):
        mx.random.seed(step_seed(seed, rank, step, index), ctx=device)
