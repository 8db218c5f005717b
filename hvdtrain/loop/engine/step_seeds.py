"""MXNet's random numbers drawn from (seed, rank, step, device): a resumed step draws what
the uninterrupted one drew.

A forward pass in training mode draws from MXNet's generator (Dropout's masks, a random
augmentation on the device); a checkpoint cannot hold that generator's state (MXNet 1.9.1
has no call that reads it). So before each optimizer step every device's generator is seeded
from the run's seed, the rank, the step and the device: a run resumed at step S draws at
step S what a run never stopped drew there, and the resume is bit-exact with dropout too.

A seed costs one ``mx.random.seed`` per device and step, as much as a small model's whole
step on a CPU (docs/performance.md, "The step's fixed cost"), so only steps that draw are
seeded: :class:`StepSeeds` seeds an epoch's first step, then reads from the model and the
batch processor whether a step draws (:mod:`.draws`; unknown counts as drawing) and seeds
the others only if so. A step that draws nothing leaves the generators as they were, so a
run that never seeds them after its first step draws later what a resumed one draws.
"""
from __future__ import annotations

from typing import Optional, Sequence

import mxnet as mx
import numpy as np

from .draws import step_draws


def step_seed(seed: int, rank: int, step: int, device: int) -> int:
    """The seed of `device` (its position among the rank's devices) for optimizer step
    `step` (counted from 0 over the run) on `rank`: 31 bits, well spread."""
    return int(np.random.SeedSequence([seed, rank, step, device]).generate_state(1)[0]
               >> 1)


def seed_step(seed: int, rank: int, step: int, devices: Sequence) -> None:
    """Seed every one of `devices` for step `step` (see the module)."""
    for index, device in enumerate(devices):
        mx.random.seed(step_seed(seed, rank, step, index), ctx=device)


class StepSeeds:
    """The seeding of one epoch's steps: every step that draws random numbers on the
    device, from (seed, rank, step, device); none with `seed` None."""

    def __init__(self, seed: Optional[int], rank: int, devices: Sequence, net, processor):
        self.seed, self.rank, self.devices = seed, rank, devices
        self.net, self.processor = net, processor
        # Whether a step draws: None until known (the first step is seeded meanwhile: a
        # hybridized model's graph is built by its first forward pass).
        self.draws: Optional[bool] = None if seed is not None else False

    def before_step(self, step: int) -> None:
        """Seed the generators for optimizer step `step` (from 0 over the run), if it may
        draw."""
        if self.draws is not False:
            seed_step(self.seed, self.rank, step, self.devices)

    def after_step(self) -> None:
        """Decide, while not yet known, whether the next steps draw."""
        if self.draws is None:
            self.draws = step_draws(self.net, self.processor)
