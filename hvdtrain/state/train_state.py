"""Where training stands: the position a checkpoint saves and a resume continues from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainState:
    """Where training stands.

    Attributes
    ----------
    epoch : int
        Epochs completed (the next one to run, counted from 0).
    step : int
        Optimizer steps taken so far in the whole run.
    epoch_samples : int
        Samples all workers together trained on in epoch `epoch` before the run stopped
        inside it (Horovod's ``processed_num``); 0 at an epoch boundary.
    epoch_skipped : int
        Of those, the training samples left out as unusable (over all workers): what
        ``--max-bad-samples`` holds the epoch to, across a stop and resume inside it.
    """

    epoch: int = 0
    step: int = 0
    epoch_samples: int = 0
    epoch_skipped: int = 0
