import mxnet as mx
import pytest

from hvdtrain.store.dist import DistContext
from hvdtrain.loop.engine.guard import FiniteGuard, NonFiniteLoss


def test_guard_names_the_first_bad_step_and_checks_on_schedule():
    guard = FiniteGuard(DistContext(), mx.cpu(), every=4)
    for step in (1, 2, 3):
        guard.observe(mx.nd.array([0.5]), step)
        guard.check(step)
    guard.observe(mx.nd.array([float("inf")]), 4)
    guard.observe(mx.nd.array([float("nan")]), 5)
    guard.check(5)  # not a check step: nothing yet
    with pytest.raises(NonFiniteLoss, match="at step 4 on rank 0; all ranks stopped at step 6"):
        guard.check(6, force=True)


def test_finite_losses_pass():
    guard = FiniteGuard(DistContext(), mx.cpu(), every=1)
    for step in range(1, 20):
        guard.observe(mx.nd.array([1e30]), step)
        guard.check(step)
