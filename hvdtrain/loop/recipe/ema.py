"""``--ema DECAY``: an exponential moving average of the model, kept on every rank.

After every optimizer step (every ``--ema-every`` N steps, with DECAY**N) each array of the
model is averaged in: ``ema = DECAY * ema + (1 - DECAY) * array``. During the learning-rate
warm-up (``--warmup-epochs``) the average is the model itself, as torchvision's reference
restarts its average through the warm-up epochs: the first, fast-moving weights are left
out. Every array, as torchvision's ``ExponentialMovingAverage`` with ``use_buffers=True``:
the weights and the arrays no gradient reaches (BatchNorm's running statistics), so that
the averaged weights are evaluated with statistics averaged over the same steps.

No communication: every rank holds the same weights after each update, so every rank's
average of them is the same (the same float32 operations on the same values). The running
statistics are the exception: between two evaluations each rank moves its own from its own
part of the batch. Their averages are therefore averaged over the ranks wherever the model's
own statistics are (:func:`hvdtrain.loop.engine.replicas.average_running_stats`, in the same
collective); as the average is linear, that gives the moving average of the rank-averaged
statistics, the same on every rank. With several devices per worker the average follows the
first device's copy.

The average starts as the model right after the start-up broadcast (or a checkpoint's
average on resume), lives in float32 on the worker's first device, is saved beside each
checkpoint's parameters as ``ema.params`` and at the end as ``model-ema.params``, both in
``save_parameters`` format: ``net.load_parameters("model-ema.params")`` loads it into the
model.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np

from ...store.gluon_internals import params_by_place, statistics_of

logger = logging.getLogger("hvdtrain")

EMA_PARAMS = "ema.params"  # beside a checkpoint's model.params
FINAL_EMA_PARAMS = "model-ema.params"  # beside the run's model.params
# MXNet 1.9.1's multi-tensor SGD kernel takes at most 60 arrays (more crash the process);
# its own optimizers pass 45 at most.
CHUNK = 45


def lerp_(targets: Sequence[mx.nd.NDArray], sources: Sequence[mx.nd.NDArray],
          weight: float) -> None:
    """``target = (1 - weight) * target + weight * source`` in place, for each pair.

    One pass over the arrays, in a few engine operations: MXNet's multi-tensor SGD update
    computes ``(1 - lr * wd) * w - lr * rescale_grad * g``, which with ``lr = 1``,
    ``wd = weight``, ``rescale_grad = -weight`` and ``g`` the source is exactly this, reading
    each array once and writing the target once (NDArray arithmetic would write a
    temporary of each source and read it back)."""
    for first in range(0, len(targets), CHUNK):
        part = list(targets[first:first + CHUNK])
        pairs = [array for pair in zip(part, sources[first:first + CHUNK]) for array in pair]
        mx.nd.multi_sgd_update(*pairs, lrs=[1.0] * len(part), wds=[weight] * len(part),
                               rescale_grad=-weight, num_weights=len(part), out=part)


class WeightAverage:
    """The moving average of every array of a model.

    Parameters
    ----------
    net : gluon.Block
        The initialised model; the average starts as its arrays now.
    decay : float
        In (0, 1): the weight the average keeps at each step.
    every : int
        Update every `every` optimizer steps, with ``decay ** every``.

    Attributes
    ----------
    arrays : dict of str to NDArray
        The average, by the names ``save_parameters`` gives (float32, first device).
    """

    def __init__(self, net, decay: float, every: int = 1):
        if not 0 < decay < 1 or every < 1:
            raise ValueError(f"decay must be in (0, 1) and every >= 1, got {decay}, {every}")
        self.decay, self.every = float(decay), int(every)
        self.warmup_steps = 0  # through this optimizer step the average copies the model
        self.params = params_by_place(net)
        self._moved_alone = statistics_of(net)
        self.names = sorted(self.params)
        self.arrays: Dict[str, mx.nd.NDArray] = {
            name: self.params[name].list_data()[0].astype("float32") for name in self.names}

    @classmethod
    def of(cls, cfg, net) -> Optional["WeightAverage"]:
        """The run's average (None without ``--ema``)."""
        return None if cfg.ema is None else cls(net, cfg.ema, cfg.ema_every)

    def update(self, step: int) -> bool:
        """Average the model in after optimizer step `step` (counted from 1 over the whole
        run) if it is one of every `every`-th (copy it, in the warm-up); returns whether
        it was."""
        if step % self.every:
            return False
        weight = 1.0 if step <= self.warmup_steps else 1.0 - self.decay ** self.every
        # Trained arrays are written by the update; the others (running statistics) by the
        # backward pass, which MXNet's engine does not track under a static graph. Sorted
        # now, not once: fine-tuning may freeze or unfreeze layers between epochs.
        trained = [n for n in self.names if self.params[n].grad_req != "null"]
        untrained = [n for n in self.names if self.params[n].grad_req == "null"]
        lerp_([self.arrays[n] for n in trained], [self._source(n) for n in trained], weight)
        if untrained:
            after = self._after_backward(trained)
            lerp_([self.arrays[n] for n in untrained],
                  [self._source(n, after) for n in untrained], weight)
        return True

    def _source(self, name: str, after: Optional[mx.nd.NDArray] = None) -> mx.nd.NDArray:
        array = self.params[name].list_data()[0]
        if after is not None:
            array = mx.nd.broadcast_add(array, after.astype(array.dtype, copy=False))
        return array.astype("float32", copy=False)

    def _after_backward(self, trained: List[str]) -> Optional[mx.nd.NDArray]:
        """A (1,) zero that MXNet's engine computes only once this step's gradients are
        all written (so once its backward passes, which move the running statistics, have
        ended): added to a statistic, it makes the engine read the statistic after them.

        Under a static graph (``hybridize(static_alloc=True)``) MXNet 1.9.1's engine does not
        know that BatchNorm's backward writes its running statistics; a plain read of them
        runs before it (seen in 49 of 50 steps)."""
        firsts = [self.params[n].list_grad()[0].reshape((-1,))[0:1] for n in trained]
        if not firsts:
            return None
        return mx.nd.zeros_like(mx.nd.add_n(*firsts) if len(firsts) > 1 else firsts[0])

    def _statistic_names(self) -> List[str]:
        return [n for n in self.names if id(self.params[n]) in self._moved_alone
                and np.issubdtype(np.dtype(self.params[n].dtype), np.floating)]

    def statistics(self) -> List[mx.nd.NDArray]:
        """The averages of the running statistics (floating point; not of frozen weights,
        which are the same everywhere), in a fixed order, the same on every rank: each
        rank's differ, and are averaged over the ranks with the model's own."""
        return [self.arrays[n] for n in self._statistic_names()]

    def files(self, statistics: Optional[Sequence[mx.nd.NDArray]] = None
              ) -> Dict[str, Dict[str, mx.nd.NDArray]]:
        """What a checkpoint holds of the average (``ema.params``), copied to host memory
        now, as a checkpoint is written in the background while training goes on;
        `statistics`, values of :meth:`statistics` to save instead (a checkpoint inside an
        epoch saves their average over the ranks, leaving each rank's own)."""
        replaced = {} if statistics is None else dict(zip(self._statistic_names(), statistics))
        copies = {n: replaced.get(n, self.arrays[n]).copyto(mx.cpu()) for n in self.names}
        for copy in copies.values():
            copy.wait_to_read()
        return {EMA_PARAMS: copies}

    @contextlib.contextmanager
    def applied(self):
        """Meanwhile the model holds the average (in every device copy); its own values
        are put back after. Every device copy of the model must hold the same values
        (as after :func:`~hvdtrain.loop.engine.replicas.average_running_stats`)."""
        mx.nd.waitall()  # statistics written by a static graph's backward: see _after_backward
        own = {n: self.params[n].list_data()[0].copy() for n in self.names}
        try:
            self._write(self.arrays)
            yield self
        finally:
            self._write(own)
            mx.nd.waitall()  # no later untracked write may overtake these copies

    def _write(self, arrays: Dict[str, mx.nd.NDArray]) -> None:
        for name in self.names:
            param = self.params[name]
            for copy in param.list_data():
                arrays[name].astype(param.dtype, copy=False).copyto(copy)

    def save(self, path: str) -> None:
        """Write the average to `path` in ``save_parameters`` format."""
        mx.nd.save(path, self.arrays)

    def load(self, path: str) -> None:
        """Read an average :meth:`save` wrote for this model."""
        saved = mx.nd.load(path)
        if not isinstance(saved, dict) or sorted(saved) != self.names:
            names = sorted(saved) if isinstance(saved, dict) else []
            extra = sorted(set(names) ^ set(self.names))[:3]
            raise ValueError(f"{path} is not an average of this model: arrays differ, "
                             f"e.g. {extra}")
        self.set_state({name: array.asnumpy() for name, array in saved.items()})

    def resume(self, checkpoint: str) -> bool:
        """Continue the average a checkpoint folder holds (``ema.params``); without one
        (saved without ``--ema``) it starts again from the resumed model, with a warning.
        Returns whether it was loaded."""
        path = os.path.join(checkpoint, EMA_PARAMS)
        if not os.path.isfile(path):
            logger.warning("checkpoint %s holds no --ema average: it starts from the resumed "
                           "model", checkpoint)
            return False
        self.load(path)
        return True

    def state(self) -> Dict[str, np.ndarray]:
        """The average as numpy arrays (waits for the pending updates)."""
        return {name: array.asnumpy() for name, array in self.arrays.items()}

    def set_state(self, state: Dict[str, np.ndarray]) -> None:
        """Put an average :meth:`state` returned back."""
        for name in self.names:
            if tuple(state[name].shape) != tuple(self.arrays[name].shape):
                raise ValueError(f"average of {name}: shape {state[name].shape}, the model's "
                                 f"{self.arrays[name].shape}")
            self.arrays[name][:] = mx.nd.array(state[name], dtype="float32",
                                               ctx=self.arrays[name].context)
