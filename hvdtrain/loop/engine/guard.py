"""Stop every rank at the same step when the loss stops being finite."""
from __future__ import annotations

import mxnet as mx

from ...store.dist import DistContext


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite on some rank; the message names the step."""


class FiniteGuard:
    """Watch each step's loss on the device and check all ranks every `every` steps.

    Recording the first bad step is a device operation, so steps do not wait on the host;
    at each check the ranks sum a vector holding every rank's first bad step, so all of them
    see the same verdict and stop at the same step. Checks also run at the end of each epoch,
    before any checkpoint is written.
    """

    def __init__(self, dist: DistContext, device, every: int = 10):
        self.dist = dist
        self.device = device
        self.every = max(1, int(every))
        self.first_bad = mx.nd.full((1,), -1.0, ctx=device)

    def observe(self, loss_sum, step: int) -> None:
        """Note `step` if `loss_sum` (this rank's loss for that step) is not finite."""
        broken = (mx.nd.contrib.isfinite(loss_sum) == 0) * (self.first_bad < 0)
        self.first_bad = mx.nd.where(broken, mx.nd.full((1,), float(step), ctx=self.device),
                                     self.first_bad)

    def check(self, step: int, force: bool = False) -> None:
        """Raise :class:`NonFiniteLoss` on every rank if any rank saw a bad loss.

        Every rank must call this at the same steps (`force` at the same points too).
        """
        if not force and step % self.every:
            return
        report = mx.nd.zeros(self.dist.num_workers)
        report[self.dist.rank] = self.first_bad.as_in_context(mx.cpu()) + 1
        if self.dist.synchronous:
            report = self.dist.sum_across_workers("finite_check", report)
        firsts = {rank: int(v) - 1 for rank, v in enumerate(report.asnumpy()) if v > 0}
        if firsts:
            first = min(firsts.values())
            ranks = sorted(r for r, s in firsts.items() if s == first)
            raise NonFiniteLoss(f"non-finite loss at step {first} on rank "
                                f"{', '.join(map(str, ranks))}; all ranks stopped at step "
                                f"{step} (no checkpoint written from these parameters)")
