"""The step's fixed cost (issue 64): what each step no longer does. The finite check keeps a
step's loss without an operator; the count vector of a step is not made from the host's
values (a wait for the engine's queue) when the step before sent the same; MAE/MSE/RMSE
read nothing on the host per batch and report their sums per element when read. (Speed
itself: scripts/bench_small.py and bench_step_phases.py, in make bench.)"""
import math

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.base import _LIB

from hvdtrain.estimator import Estimator
from hvdtrain.loop.engine.counts import StepCounts
from hvdtrain.loop.engine.guard import FiniteGuard
from hvdtrain.store.dist import DistContext


@pytest.fixture
def calls(monkeypatch):
    """Counts of MXNet's C calls by name, for the names asked (`calls.watch(name)`)."""
    counted = {}

    class Calls(dict):
        def watch(self, name):
            function = getattr(_LIB, name)
            counted[name] = 0

            def counting(*args):
                counted[name] += 1
                return function(*args)
            monkeypatch.setattr(_LIB, name, counting)

    seen = Calls()
    seen.counted = counted
    return seen


def test_the_finite_check_dispatches_nothing_per_step(calls):
    guard = FiniteGuard(DistContext(), mx.cpu(), every=10)
    losses = [mx.nd.array([0.5]) for _ in range(9)] + [mx.nd.array([float("nan")])]
    calls.watch("MXImperativeInvokeEx")
    for step, loss in enumerate(losses, 1):
        guard.observe(loss, step)
        if step < 10:
            guard.check(step)
    assert calls.counted["MXImperativeInvokeEx"] == 0
    with pytest.raises(RuntimeError, match="at step 10 on rank 0"):
        guard.check(10)


class Summing:
    """Two workers whose sum is this rank's values doubled."""

    num_workers, rank, synchronous = 2, 0, True

    def sum_across_workers(self, name, values):
        values *= 2
        return values


def test_a_steps_counts_are_not_made_from_the_hosts_values_again(calls):
    counts = StepCounts(Summing(), exchange=True)
    counts.submit(32, 0, (0, 1))
    assert counts.result() == (64, 0, (0, 2))
    calls.watch("MXNDArraySyncCopyFromCPU")
    for _ in range(5):
        counts.submit(32, 0, (0, 1))
        assert counts.result() == (64, 0, (0, 2))  # the kept vector itself never summed
    assert calls.counted["MXNDArraySyncCopyFromCPU"] == 0
    counts.submit(31, 1, (0, 0), divisor=7.0)  # other values: made once
    assert counts.result() == (62, 2, (0, 0)) and counts.divisor == 14.0
    assert calls.counted["MXNDArraySyncCopyFromCPU"] == 1


def test_rmse_reads_nothing_per_batch_and_reports_per_element(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 5)).astype(np.float32)
    y = x[:, :1].astype(np.float32)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(1))
    net.initialize(mx.init.Xavier())
    rmse = mx.metric.RMSE()
    own = []  # MXNet's own update begins by checking the shapes it will read on the host
    check = mx.metric.check_label_shapes
    monkeypatch.setattr(mx.metric, "check_label_shapes",
                        lambda *a, **k: (own.append(a), check(*a, **k))[1])
    est = Estimator(net, gluon.loss.L2Loss(), train_metrics=[rmse], context=mx.cpu(),
                    trainer=gluon.Trainer(net.collect_params(), "sgd",
                                          {"learning_rate": 0.0}),
                    kvstore="none", log_interval=0)
    est.fit(gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=8), epochs=1)
    assert own == []  # MXNet's own update (two host reads a batch) never ran
    pred = net(mx.nd.array(x)).asnumpy()  # the rate is 0: the weights never moved
    name, value = rmse.get()
    assert value == pytest.approx(math.sqrt(np.mean((pred - y) ** 2)), rel=1e-5)
    rmse.update([mx.nd.array(y[:4])], [mx.nd.array(pred[:4] + 1.0)])  # a handler's own
    assert rmse.get()[1] == pytest.approx(
        math.sqrt((np.sum((pred - y) ** 2) + np.sum((pred[:4] + 1.0 - y[:4]) ** 2)) / 44),
        rel=1e-5)


def test_counts_made_before_the_pass_are_sent_after_it_with_the_verdict():
    """``submit(later=True)`` (before the step's last pass) sums nothing until ``send``,
    which carries the rank's verdict word: summed into ``failed``."""
    names = []

    class Counting(Summing):
        def sum_across_workers(self, name, values):
            names.append(name)
            return super().sum_across_workers(name, values)

    counts = StepCounts(Counting(), exchange=True)
    counts.submit(32, 0, (0, 1), later=True)
    assert names == []
    counts.send(False)
    assert counts.result() == (64, 0, (0, 2)) and counts.failed == 0
    counts.submit(32, 0, (0, 1), later=True)
    counts.send(True)  # this rank's pass raised: the word set (doubled by the fake)
    assert counts.result() == (64, 0, (0, 2)) and counts.failed == 2
    assert names == ["step_counts", "step_counts"]
