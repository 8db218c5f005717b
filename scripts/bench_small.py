"""The step's fixed cost: a small MLP (64-256-256-1, L2 loss, batch 32 a rank), where a step
computes so little that whatever a loop does per step shows.

    horovodrun -np 2 -H localhost:2 python scripts/bench_small.py --impl hvdtrain --out PREFIX
    python scripts/bench_small.py --impl gluon --out PREFIX          # one process, no launcher

``--impl``:

- ``hvdtrain``: ``hvdtrain.Estimator`` (MXNet's Estimator API) with an RMSE metric;
- ``horovod``: the plain loop Horovod's MXNet examples teach: ``hvd.DistributedTrainer``,
  the parameters broadcast, a hybridized net, a Gluon ``DataLoader`` over this rank's share,
  the metric updated every batch;
- ``estimator``: MXNet's own ``Estimator`` with ``hvd.DistributedTrainer``;
- ``gluon``: the plain Gluon loop with no Horovod at all (one process).

``--dropout P`` puts Dropout(P) after the first layer. Each run times ``--steps`` steps
after ``--warmup``, the engine drained (``mx.nd.waitall``) at both ends, and writes
``PREFIX.rank<R>.json`` with its steps per second. scripts/bench.py runs the rows of
:data:`ROWS` (:func:`measure_rows`): in each round every loop of a row once, one after the
other, so that the loops being compared see the same load; each loop's median over the
rounds, and the median of its per-round ratios to the row's first loop (the plain one).
Every process runs with ``OMPI_MCA_mpi_yield_when_idle=1``, which hvdtrain sets for itself:
a plain loop whose Open MPI spins while it waits runs many times slower on two cores.
"""
import argparse
import json
import os
import statistics
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from hvdtrain.store.broadcast import broadcast_

FEATURES, WIDTH = 64, 256
MAX_RANKS = 4


def make_net(dropout):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(WIDTH, activation="relu"))
    if dropout:
        net.add(gluon.nn.Dropout(dropout))
    net.add(gluon.nn.Dense(WIDTH, activation="relu"), gluon.nn.Dense(1))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def make_data(args):
    """Enough samples for every step at up to MAX_RANKS ranks."""
    samples = args.batch_size * MAX_RANKS * (args.warmup + args.steps + 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    y = x[:, :1] * 0.5 + np.sin(x[:, 1:2])
    return gluon.data.ArrayDataset(x, y.astype(np.float32))


class Clock:
    """Marks the end of step `warmup` and of step `warmup + steps`, the engine drained."""

    def __init__(self, warmup, steps):
        self.marks, self.batches = {}, 0
        self.at = (warmup, warmup + steps)

    def tick(self):
        self.batches += 1
        if self.batches in self.at:
            mx.nd.waitall()
            self.marks[self.batches] = time.perf_counter()

    def steps_per_sec(self):
        first, last = self.at
        return (last - first) / (self.marks[last] - self.marks[first])


def clock_handler(clock):
    from mxnet.gluon.contrib.estimator.event_handler import BatchEnd

    class Tick(BatchEnd):
        def batch_end(self, estimator, *args, **kwargs):
            clock.tick()

    return Tick()


def same_start(hvd, params):
    """Rank 0's weights on every rank, untimed. Users call Horovod's broadcast_parameters
    here; Horovod 0.28.1's broadcast can crash a rank now and then
    (hvdtrain/store/broadcast.py), and a sum-allreduce sets the same values."""
    for index, (_, param) in enumerate(sorted(params.items())):
        broadcast_(hvd, param.data(), f"plain.init.{index}")
    mx.nd.waitall()


def plain_loop(args, clock, hvd):
    """Horovod's example loop (`hvd` None: Gluon's alone, one process)."""
    rank, size = (hvd.rank(), hvd.size()) if hvd else (0, 1)
    net = make_net(args.dropout)
    params = net.collect_params()
    opt = {"learning_rate": 0.01, "momentum": 0.9}
    if hvd:
        net(mx.nd.zeros((1, FEATURES)))  # Gluon defers shapes: force them, then broadcast
        same_start(hvd, params)
        trainer = hvd.DistributedTrainer(params, "sgd", opt)
    else:
        trainer = gluon.Trainer(params, "sgd", opt, kvstore=None)
    data = make_data(args)
    sampler = list(range(rank, len(data), size))
    loader = gluon.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    loss_fn, metric = gluon.loss.L2Loss(), mx.metric.RMSE()
    for step, (x, y) in enumerate(loader):
        if step == args.warmup + args.steps:
            break
        with autograd.record():
            out = net(x)
            loss = loss_fn(out, y)
        loss.backward()
        trainer.step(args.batch_size)
        metric.update([y], [out])
        clock.tick()


def estimator_loop(args, clock, hvd, ours):
    from mxnet.gluon.contrib.estimator import Estimator as MXEstimator
    from hvdtrain.estimator import Estimator
    net = make_net(args.dropout)
    opt = {"learning_rate": 0.01, "momentum": 0.9}
    data = make_data(args)
    steps = args.warmup + args.steps
    if ours:
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt)
        est = Estimator(net, gluon.loss.L2Loss(), train_metrics=mx.metric.RMSE(),
                        trainer=trainer, max_steps=steps)
        loader = gluon.data.DataLoader(data, batch_size=args.batch_size, shuffle=True)
        est.fit(loader, epochs=1, event_handlers=[clock_handler(clock)])
        return
    size = hvd.size()
    net(mx.nd.zeros((1, FEATURES)))
    same_start(hvd, net.collect_params())
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", opt)
    est = MXEstimator(net, gluon.loss.L2Loss(), train_metrics=mx.metric.RMSE(),
                      trainer=trainer)
    sampler = list(range(hvd.rank(), len(data), size))
    loader = gluon.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    est.fit(loader, batches=steps, event_handlers=[clock_handler(clock)])


# (ranks: 0 = one process with no launcher, else under horovodrun -np N; dropout; the loops
# compared, the plain one first).
ROWS = [
    (2, 0.0, ("horovod", "hvdtrain", "estimator")),
    (2, 0.1, ("horovod", "hvdtrain")),
    (1, 0.0, ("horovod", "hvdtrain")),
    (0, 0.0, ("gluon", "hvdtrain")),
]


def measure_rows(runs, worker, horovodrun, rounds, steps):
    """The rows of :data:`ROWS`, each loop run `rounds` times interleaved with the others
    of its row; `worker` is this script's command, `horovodrun(n)` the launcher's."""
    runs = runs.with_env({"OMPI_MCA_mpi_yield_when_idle": "1"})
    rows = []
    for ranks, dropout, loops in ROWS:
        rates = {loop: [] for loop in loops}
        for _ in range(rounds):
            for loop in loops:
                cmd = (horovodrun(ranks) if ranks else []) + worker + [
                    "--impl", loop, "--dropout", str(dropout), "--steps", str(steps)]
                records = runs.collect([runs.start(cmd)])
                rates[loop].append(min(r["steps_per_sec"] for r in records))
        plain = rates[loops[0]]
        for loop in loops:
            rows.append({
                "row": "small MLP", "ranks": ranks or 1,
                "launcher": "horovodrun" if ranks else "none", "dropout": dropout,
                "loop": loop, "steps_per_sec": statistics.median(rates[loop]),
                "rounds": rates[loop],
                "vs_plain": statistics.median(a / b for a, b in zip(rates[loop], plain)),
                "load_average": os.getloadavg()[0]})
    return rows


def table(rows):
    lines = ["ranks | launcher | dropout | loop | steps/s (median) | x the plain loop "
             "(median of rounds) | load"]
    for r in rows:
        lines.append(f"{r['ranks']} | {r['launcher']} | {r['dropout']:g} | {r['loop']} | "
                     f"{r['steps_per_sec']:.1f} | {r['vs_plain']:.2f} | "
                     f"{r['load_average']:.1f}")
    return "\n".join(lines)


def parse(parser, steps, warmup):
    """`parser`'s arguments (the output prefix among them) and a run's own (the MLP's
    dropout and batch, the steps timed), parsed; one OpenMP thread unless set."""
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=warmup)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return parser.parse_args()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("hvdtrain", "horovod", "estimator", "gluon"),
                   required=True)
    p.add_argument("--out", required=True, help="write PREFIX.rank<R>.json")
    args = parse(p, steps=300, warmup=20)
    hvd = None
    if args.impl != "gluon" and args.impl != "hvdtrain":
        import horovod.mxnet as hvd
        hvd.init()
    clock = Clock(args.warmup, args.steps)
    if args.impl in ("horovod", "gluon"):
        plain_loop(args, clock, hvd)
    else:
        if hvd is None:
            import horovod.mxnet as hvd  # hvdtrain's store has initialised it
        estimator_loop(args, clock, hvd, ours=args.impl == "hvdtrain")
    rank = hvd.rank() if hvd else 0
    record = {"rank": rank, "ranks": hvd.size() if hvd else 1, "impl": args.impl,
              "dropout": args.dropout, "steps_per_sec": clock.steps_per_sec()}
    with open(f"{args.out}.rank{rank}.json", "w") as out:
        json.dump(record, out)


if __name__ == "__main__":
    main()
