"""Stop every rank at the same step when the loss stops being finite."""
from __future__ import annotations

import mxnet as mx
import numpy as np

from ...store.dist import DistContext


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite on some rank; the message names the step."""


class FiniteGuard:
    """Watch each step's loss and check all ranks every `every` steps.

    A step's loss is only kept (no device operation, no host wait per step); at each check
    the losses kept since the last one are read at once, and the ranks sum a vector holding
    every rank's first bad step, so all of them see the same verdict and stop at the same
    step. Checks also run at the end of each epoch, before any checkpoint is written.
    """

    def __init__(self, dist: DistContext, device, every: int = 10):
        self.dist = dist
        self.device = device
        self.every = max(1, int(every))
        self.first_bad = -1  # this rank's first step with a loss not finite, once read
        self._kept = []  # (step, loss (1,) on `device`) observed since the last check

    def observe(self, loss_sum, step: int) -> None:
        """Keep `loss_sum` (this rank's loss for `step`, not waited for) for the next
        check."""
        if self.first_bad < 0:
            self._kept.append((step, loss_sum))

    def check(self, step: int, force: bool = False) -> None:
        """Raise :class:`NonFiniteLoss` on every rank if any rank saw a bad loss.

        Every rank must call this at the same steps (`force` at the same points too).
        """
        if not force and step % self.every:
            return
        kept, self._kept = self._kept, []
        if kept and self.first_bad < 0:
            losses = mx.nd.concat(*[loss.reshape((1,)) for _, loss in kept], dim=0)
            bad = np.flatnonzero(~np.isfinite(losses.asnumpy()))
            if bad.size:
                self.first_bad = kept[int(bad[0])][0]
        report = mx.nd.zeros(self.dist.num_workers)
        report[self.dist.rank] = self.first_bad + 1
        if self.dist.synchronous:
            report = self.dist.sum_across_workers("finite_check", report)
        firsts = {rank: int(v) - 1 for rank, v in enumerate(report.asnumpy()) if v > 0}
        if firsts:
            first = min(firsts.values())
            ranks = sorted(r for r, s in firsts.items() if s == first)
            raise NonFiniteLoss(f"non-finite loss at step {first} on rank "
                                f"{', '.join(map(str, ranks))}; all ranks stopped at step "
                                f"{step} (no checkpoint written from these parameters)")
