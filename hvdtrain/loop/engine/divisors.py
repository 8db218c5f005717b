"""Losses whose gradient is already divided by a count of the batch: the divisor rule.

A per-sample loss (every Gluon loss) leaves each rank's gradient a *sum* over its samples:
the store sums the ranks' sums and the step divides by the global sample count. Some losses
divide their gradient themselves, by a count of the batch they were given: GluonCV's
``SoftmaxCrossEntropyLoss`` (``size_average=True``, its default) by the labels that are not
ignored, its ``SSDMultiBoxLoss`` by the positive anchors. On N ranks each rank divides by its
own count, so the summed gradient is a sum of N differently scaled means: N times one
process's with equal counts, anything with unequal ones.

The rule, the same on every rank: a batch processor says what each micro-batch's gradient is
already divided by (``loss_divisor(batch, out)``, see
:mod:`hvdtrain.estimator.batch_processor`); :class:`StepDivisors` multiplies this rank's
gradients by it before the exchange, which makes them sums again, and the step divides the
summed gradient by the divisors summed over the ranks (they travel in the step's counts,
:class:`~hvdtrain.loop.engine.counts.StepCounts`) as well as by the global sample count, as
``trainer.step(batch_size)`` does in one process. So N ranks apply what one process's
backward over the global batch would give, then its step: ``sum_r c_r g_r / sum_r c_r``,
with ``g_r = S_r / c_r`` the rank's gradient and ``S_r`` the plain sum one process would
have divided by the whole batch's count. A rank whose count is 0 (no object in its batch)
adds nothing and trains on; a step whose counts sum to 0 everywhere takes no update.

A divisor is a number (every device part's gradient divided by it: a count over the rank's
whole batch, as SSDMultiBoxLoss takes) or a list with one per device part (each part divided
by its own count, as a loss called once per device divides). The count the step divides by
is the number, or the list's sum.

Cost: one in-place multiply of each gradient bucket's flat buffer a step (the buckets hold
every gradient as a view, :meth:`~hvdtrain.store.buckets.BucketedTrainer.gradient_buffers`),
skipped for a factor of exactly 1. With ``accumulate`` > 1 the micro-batches' gradients add
up in place (``grad_req='add'``), so a micro-batch's own share cannot be scaled after the
next has added to it: each but the step's last is moved, scaled, into a stash (one more
gradient-sized buffer a device), which the last adds back.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

import mxnet as mx

from ...store.buckets import BucketedTrainer


def as_parts(divisor, parts: int) -> Tuple[List[float], float]:
    """`divisor` (a number, or one per device part) as one factor per device part, and the
    count it adds to the step (the number, or the parts' sum), as ``(factors, count)``."""
    if isinstance(divisor, mx.nd.NDArray):
        divisor = divisor.asnumpy().tolist() if divisor.size > 1 else divisor.asscalar()
    if isinstance(divisor, (list, tuple)):
        factors = [float(v.asscalar() if isinstance(v, mx.nd.NDArray) else v) for v in divisor]
        if len(factors) != parts:
            raise ValueError(f"loss_divisor returned {len(factors)} divisor(s) for {parts} "
                             f"device part(s): one number, or one per part")
        return factors, sum(factors)
    value = float(divisor)
    return [value] * parts, value


def check_divisor(count: float, who: str) -> None:
    """Refuse a divisor that is negative or not finite, naming `who` returned it."""
    if not count >= 0 or count == float("inf"):
        raise ValueError(f"{who} returned a loss divisor of {count}: it must be a count, a "
                         f"finite number >= 0")


class StepDivisors:
    """This rank's divisors of the step being built, applied to its gradients.

    Parameters
    ----------
    trainer : gluon.Trainer
        Its gradients (the buckets' flat buffers for a BucketedTrainer) are scaled.
    params : list of Parameter
        The trainer's parameters (what a plain Trainer's gradients are).
    """

    def __init__(self, trainer, params: Sequence):
        self.trainer, self.params = trainer, list(params)
        self.count = 0.0  # the step's divisor so far, on this rank
        self._stash: Optional[List[List[mx.nd.NDArray]]] = None  # per device, per buffer
        self._stashed: Set[int] = set()  # the devices whose stash holds this step's sums

    def _buffers(self, device: int) -> List[mx.nd.NDArray]:
        """Arrays holding every gradient of the `device`-th context once, as the exchange
        will read them (a gradient backward wrote outside its bucket brought in first)."""
        if isinstance(self.trainer, BucketedTrainer):
            self.trainer.gather_gradients()
            return self.trainer.gradient_buffers(device)
        return [p.list_grad()[device] for p in self.params if p.grad_req != "null"]

    def add(self, factors: Sequence[float], count: float, devices: Sequence[int],
            last: bool) -> None:
        """A micro-batch's divisors: `factors[i]` what the gradient on device `devices[i]`
        is divided by, `count` what it adds to the step's divisor; `last`: the step's last
        micro-batch (the gradients then go to the exchange)."""
        self.count += count
        buffers = {device: self._buffers(device) for device in devices}
        if not last:  # move the micro-batch's share, made a sum, into the stash
            for factor, device in zip(factors, devices):
                for kept, grad in zip(self._stash_of(device, buffers[device]),
                                      buffers[device]):
                    if factor != 1.0:
                        grad *= factor  # in place: no temporary of the buffer's size
                    kept += grad
                    grad[:] = 0
                self._stashed.add(device)
            return
        for factor, device in zip(factors, devices):
            if factor != 1.0:
                for grad in buffers[device]:
                    grad *= factor
        for device in sorted(self._stashed):  # the step's earlier micro-batches
            grads = buffers.get(device) or self._buffers(device)
            for kept, grad in zip(self._stash[device], grads):
                grad += kept
                kept[:] = 0
        self._stashed = set()

    def _stash_of(self, device: int, buffers: List[mx.nd.NDArray]) -> List[mx.nd.NDArray]:
        """The stash of `device`, shaped as its gradient `buffers` (made again when the
        buckets were planned since: the first step plans them)."""
        if self._stash is None:
            self._stash = [[] for _ in range(len(self.params[0].list_ctx()))]
        stash = self._stash[device]
        if [k.shape for k in stash] != [g.shape for g in buffers]:
            stash = self._stash[device] = [mx.nd.zeros(g.shape, ctx=g.context, dtype=g.dtype)
                                           for g in buffers]
        return stash

    def take(self) -> float:
        """This rank's divisor of the step, and a fresh start for the next."""
        count, self.count = self.count, 0.0
        return count

    def discard(self) -> None:
        """Forget the step's stash (a step not applied: an epoch ended before it)."""
        self.count = 0.0
        for device in self._stashed:
            for kept in self._stash[device]:
                kept[:] = 0
        self._stashed = set()
