"""What a sharded trainer (:mod:`.sharded`) shows of its optimizer state to what expects
the whole of it, and what it holds."""
from __future__ import annotations

from typing import List

import mxnet as mx
import numpy as np
from mxnet import optimizer as opt

NO_WHOLE_STATE = ("shard_optimizer: each rank holds its slice of the optimizer state only; "
                  "the Trainer's own updater holds none to copy (save and load through "
                  "Trainer.save_states/load_states on every rank)")


class _SlicedAway(dict):
    """The replicated state of a sharded trainer: none. Read by key (the replica check
    compares nothing), never enumerated for a save."""

    def items(self):
        raise NotImplementedError(NO_WHOLE_STATE)


class WholeStateRefused(opt.Updater):
    """The Trainer's updater under sharding: empty, and refusing a copy of its state (the
    whole state is gathered by ``ShardedTrainer.save_states``)."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.states = _SlicedAway()

    def __call__(self, index, grad, weight):
        raise RuntimeError("shard_optimizer: the Trainer's own updater does not run")

    def get_states(self, dump_optimizer=False):
        raise NotImplementedError(NO_WHOLE_STATE)

    def set_states(self, states):
        raise NotImplementedError(NO_WHOLE_STATE)


def _arrays(state) -> List[mx.nd.NDArray]:
    if state is None:
        return []
    if isinstance(state, mx.nd.NDArray):
        return [state]
    return [array for part in state for array in _arrays(part)]


def state_bytes(states: dict) -> int:
    """Bytes of the optimizer state arrays in `states` (an updater's)."""
    return sum(array.size * np.dtype(array.dtype).itemsize
               for state in states.values() for array in _arrays(state))
