"""Where a small model's step goes: the main thread's microseconds a step in each phase of
hvdtrain's step, on the MLP of scripts/bench_small.py (64-256-256-1, batch 32 a rank).

    python scripts/bench_step_phases.py --out PREFIX                        # one process
    horovodrun -np 2 -H localhost:2 python scripts/bench_step_phases.py --out PREFIX

Each phase's functions are wrapped with a clock that counts their own time (a phase called
inside another is taken out of the outer one's); what is left of the step is "the loop's
own". MXNet runs operators in its engine's threads: a phase is what it costs the main thread
to dispatch its work, plus any wait for the engine or the peers it makes (reading the step's
counts waits for the other rank's). The same names exist in hvdtrain before issue 64, so the
script measures the code found first on PYTHONPATH. Times are noisy on a shared machine;
beside them each phase's count of MXNet operators dispatched (imperative calls and graph
runs) and of host waits (a read to the host, an array made from the host's values, a wait
for an array) a step, which do not depend on the load. Writes ``PREFIX.rank<R>.json``.
"""
import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mxnet as mx  # noqa: E402
from mxnet import gluon  # noqa: E402

import bench_small  # noqa: E402

# phase -> (module, owner (a class name, or None for a module function), attribute).
PHASES = {
    "batch fetch and split": [("hvdtrain.data.reshard", "ShardedLoader", "__iter__"),
                              ("hvdtrain.estimator.batch_processor", None, "split_over")],
    "forward/backward dispatch": [("hvdtrain.estimator.adapters", "Processor", "fit_batch")],
    "counts and divisors": [("hvdtrain.loop.engine.counts", "StepCounts", "submit"),
                            ("hvdtrain.loop.engine.counts", "StepCounts", "result"),
                            ("hvdtrain.loop.engine.counts", "LeftOut", "of"),
                            ("hvdtrain.loop.engine.epoch", None, "_positions"),
                            ("hvdtrain.estimator.adapters", "Processor", "batch_samples")],
    "seeds": [("hvdtrain.loop.engine.step_seeds", "StepSeeds", "before_step"),
              ("hvdtrain.loop.engine.step_seeds", "StepSeeds", "after_step"),
              ("hvdtrain.loop.engine.epoch", None, "seed_step")],
    "exchange": [("hvdtrain.store.buckets", "BucketedTrainer", "_allreduce_grads")],
    "update": [("hvdtrain.loop.engine.epoch", None, "_update")],
    "finite check": [("hvdtrain.loop.engine.guard", "FiniteGuard", "observe"),
                     ("hvdtrain.loop.engine.guard", "FiniteGuard", "check"),
                     ("hvdtrain.loop.engine.epoch", None, "_loss_sum")],
    "votes, layouts, watchdog": [
        ("hvdtrain.loop.run.boundary", "Boundary", "vote"),
        ("hvdtrain.loop.run.boundary", "Boundary", "after_step"),
        ("hvdtrain.loop.engine.layouts", "InferenceLayouts", "settle"),
        ("hvdtrain.runtime.watchdog", "Watchdog", "beat")],
    "handlers": [("hvdtrain.estimator.adapters", "Handlers", "batch_begin"),
                 ("hvdtrain.estimator.adapters", "Handlers", "batch_end")],
    "metrics": [("hvdtrain.loop.engine.metrics", "MetricBook", "update")],
}


# MXNet's C calls counted, by what they are.
COUNTED = {"MXImperativeInvokeEx": "ops", "MXInvokeCachedOpEx": "ops",
           "MXNDArraySyncCopyToCPU": "waits", "MXNDArraySyncCopyFromCPU": "waits",
           "MXNDArrayWaitToRead": "waits", "MXNDArrayWaitToWrite": "waits",
           "MXNDArrayWaitAll": "waits"}


class Clocks:
    """Own time per phase: a call inside another's is taken out of the outer one; and the
    operators and host waits of each phase (outside any: "the loop's own")."""

    def __init__(self):
        self.totals = defaultdict(float)
        self.counts = defaultdict(int)  # (phase, "ops" or "waits") -> calls
        self.stack = []  # [phase, time spent in calls inside it]
        self.on = False

    def count_calls(self):
        """Count MXNet's C calls of :data:`COUNTED` by the phase they are made in."""
        from mxnet.base import _LIB
        for name, kind in COUNTED.items():
            self._count(_LIB, name, kind)

    def _count(self, lib, name, kind):
        function = getattr(lib, name)

        def counted(*args):
            if self.on:
                phase = self.stack[-1][0] if self.stack else "the loop's own"
                self.counts[(phase, kind)] += 1
            return function(*args)
        setattr(lib, name, counted)

    def enter(self, phase):
        self.stack.append([phase, 0.0])
        return time.perf_counter()

    def leave(self, start):
        spent = time.perf_counter() - start
        phase, inner = self.stack.pop()
        if self.on:
            self.totals[phase] += spent - inner
        if self.stack:
            self.stack[-1][1] += spent

    def wrap(self, phase, function):
        def timed(*args, **kwargs):
            start = self.enter(phase)
            try:
                return function(*args, **kwargs)
            finally:
                self.leave(start)
        return timed

    def wrap_iterator(self, phase, method):
        def timed_iter(loader):
            iterator = method(loader)
            while True:
                start = self.enter(phase)
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                finally:
                    self.leave(start)
                yield item
        return timed_iter


def instrument(clocks):
    import importlib
    found = []
    for phase, targets in PHASES.items():
        for module_name, owner_name, attribute in targets:
            module = importlib.import_module(module_name)
            owner = getattr(module, owner_name, None) if owner_name else module
            if owner is None or not hasattr(owner, attribute):
                continue  # not in this version of hvdtrain
            original = getattr(owner, attribute)
            wrapped = clocks.wrap_iterator(phase, original) if attribute == "__iter__" \
                else clocks.wrap(phase, original)
            setattr(owner, attribute, wrapped)
            found.append(f"{owner_name or module_name}.{attribute}")
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="write PREFIX.rank<R>.json")
    args = bench_small.parse(p, steps=400, warmup=30)
    clocks = Clocks()
    wrapped = instrument(clocks)
    clocks.count_calls()
    from mxnet.gluon.contrib.estimator.event_handler import BatchEnd
    from hvdtrain.estimator import Estimator
    marks = {}

    class Mark(BatchEnd):
        def __init__(self):
            self.batches = 0

        def batch_end(self, estimator, *_, **__):
            self.batches += 1
            if self.batches in (args.warmup, args.warmup + args.steps):
                mx.nd.waitall()
                marks[self.batches] = time.perf_counter()
                clocks.on = self.batches == args.warmup

    net = bench_small.make_net(args.dropout)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                          "momentum": 0.9})
    est = Estimator(net, gluon.loss.L2Loss(), train_metrics=mx.metric.RMSE(), trainer=trainer,
                    max_steps=args.warmup + args.steps)
    loader = gluon.data.DataLoader(bench_small.make_data(args), batch_size=args.batch_size,
                                   shuffle=True)
    est.fit(loader, epochs=1, event_handlers=[Mark()])
    step_us = 1e6 * (marks[args.warmup + args.steps] - marks[args.warmup]) / args.steps
    phases = {phase: 1e6 * clocks.totals.get(phase, 0.0) / args.steps for phase in PHASES}
    phases["the loop's own"] = step_us - sum(phases.values())
    per_step = {kind: {phase: clocks.counts.get((phase, kind), 0) / args.steps
                       for phase in phases} for kind in ("ops", "waits")}
    record = {"rank": est.rank, "ranks": est.dist.num_workers, "step_us": step_us,
              "phases_us": phases, "ops_per_step": per_step["ops"],
              "waits_per_step": per_step["waits"], "wrapped": wrapped,
              "dropout": args.dropout}
    with open(f"{args.out}.rank{est.rank}.json", "w") as out:
        json.dump(record, out, indent=1)


if __name__ == "__main__":
    main()
