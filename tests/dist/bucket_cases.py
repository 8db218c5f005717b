"""Zero-copy gradient buckets against a plain Gluon Trainer, case by case.

Usage: python bucket_cases.py OUT_DIR [CASE ...]   (under a launcher, or as one process)

For each case and each way of running the net (imperative, ``hybridize()``, and
``hybridize(static_alloc=True, static_shape=True)``), three nets are built separately and
start from the same parameters (saved by the first, loaded by the others): one trains with
a BucketedTrainer, two with Gluon's own Trainer over the same store, through the same
actions on their parameters. Each rank feeds batches of its own. Writes
OUT_DIR/buckets<R>.json: per case and mode, the largest difference between the bucketed
net's parameters and the first plain net's, and between the two plain nets', each net's
largest value, the bucketed and first plain net's parameters (to compare ranks), and how
the trainer coped.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import hvdtrain  # noqa: F401  registers 'horovod'
from hvdtrain.store.buckets import BucketedTrainer
from hvdtrain.store.gluon_internals import set_up_store

MODES = {"imperative": None, "hybridize": {},
         "static": {"static_alloc": True, "static_shape": True}}
ONE, OTHER = mx.cpu(0), mx.cpu(1)
BUCKET_MB = 0.0005  # several buckets for this small net (about 1.6 KiB of gradients)


def build(devices, mode, path):
    """A small net with deferred shapes; from the parameters in `path` if it exists."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.BatchNorm(), gluon.nn.Dense(10))
    if os.path.exists(path):
        net.load_parameters(path, ctx=devices)
    else:
        mx.random.seed(7)  # the same start on every rank, as after a broadcast
        net.initialize(mx.init.Xavier(), ctx=devices)
        with autograd.train_mode():
            net(mx.nd.zeros((1, 12), ctx=devices[0]))
        net.save_parameters(path)
    if MODES[mode] is not None:
        net.hybridize(**MODES[mode])
    return net


class Run:
    """One net and its trainer, stepped with batches that depend on the rank and step."""

    def __init__(self, net, trainer, devices, rank, dtype="float32"):
        self.net, self.trainer, self.devices, self.rank = net, trainer, devices, rank
        self.dtype, self.steps = dtype, 0
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def backward(self):
        rng = np.random.RandomState(1000 * self.rank + self.steps)
        x = mx.nd.array(rng.uniform(-1, 1, (8, 12)), dtype=self.dtype)
        y = mx.nd.array(rng.randint(0, 10, 8), dtype=self.dtype)
        xs = gluon.utils.split_and_load(x, self.devices)
        ys = gluon.utils.split_and_load(y, self.devices)
        with autograd.record():
            losses = [self.loss(self.net(a), b) for a, b in zip(xs, ys)]
        autograd.backward(losses)

    def step(self, backwards=1):
        for _ in range(backwards):
            self.backward()
        self.trainer.step(8 * 2)
        self.steps += 1

    def train(self, steps):
        for _ in range(steps):
            self.step()


def settle():
    """Wait for the last backward pass. Under static_alloc the engine does not track
    BatchNorm's write of its running statistics (docs/training.md): an action that reads or
    overwrites them (reset_ctx, cast, load_parameters) could otherwise race with it, in
    either net."""
    mx.nd.waitall()


def case_backward_before_setup(run):
    run.train(4)  # the Trainer sets up its store (and the buckets) inside its first step


def case_setup_first(run):
    set_up_store(run.trainer, 16)  # as hvdtrain's broadcast_parameters does
    run.train(4)


def case_unfreeze(run):
    frozen = run.net[0].collect_params()
    frozen.setattr("grad_req", "null")
    run.train(2)
    frozen.setattr("grad_req", "write")  # 'null' -> 'write': gradients created
    run.train(3)


def case_freeze(run):
    run.train(2)
    run.net[2].collect_params().setattr("grad_req", "null")
    run.train(2)


def case_grad_add(run):
    run.train(2)
    run.net.collect_params().setattr("grad_req", "add")  # gradients re-created
    for _ in range(3):  # accumulate two backward passes per step
        run.step(backwards=2)
        run.net.collect_params().zero_grad()


def case_reset_ctx(run):
    run.train(2)
    settle()
    run.net.collect_params().reset_ctx(OTHER)
    run.devices = [OTHER]
    run.train(3)


def case_cast(run):
    run.train(2)
    settle()
    run.net.cast("float64")
    run.dtype = "float64"
    run.train(3)


def case_load_parameters(run, path):
    run.train(2)
    settle()
    run.net.load_parameters(path, ctx=run.devices)
    run.train(3)


def case_two_devices(run):
    run.train(4)


CASES = {"backward_before_setup": ([ONE], case_backward_before_setup),
         "setup_first": ([ONE], case_setup_first),
         "unfreeze": ([ONE], case_unfreeze), "freeze": ([ONE], case_freeze),
         "grad_add": ([ONE], case_grad_add), "reset_ctx": ([ONE], case_reset_ctx),
         "cast": ([ONE], case_cast), "load_parameters": ([ONE], case_load_parameters),
         "two_devices": ([ONE, OTHER], case_two_devices)}


STATELESS = ("reset_ctx", "cast")
NETS = ("bucketed", "plain", "plain_again")


def _differences(arrays, others):
    """The largest absolute difference of each pair of arrays."""
    return [float(np.max(np.abs(a - b))) for a, b in zip(arrays, others)]


def run_case(name, mode, store, out_dir):
    devices, actions = CASES[name]
    path = os.path.join(out_dir, f"start-{name}-{mode}-{store.rank}.params")
    finals = {}
    # A second plain net: two plain nets agreeing where the bucketed one parts says the
    # buckets are at fault; plain nets parting says the fault is beneath them.
    for net_kind in NETS:
        net = build(list(devices), mode, path)
        # SGD with momentum keeps state per parameter: after reset_ctx or cast it would
        # have the old device or dtype, which Gluon's own Trainer does not change either.
        opt = {"learning_rate": 0.1, "momentum": 0.0 if name in STATELESS else 0.9}
        trainer_class = BucketedTrainer if net_kind == "bucketed" else gluon.Trainer
        extra = {"bucket_mb": BUCKET_MB} if net_kind == "bucketed" else {}
        trainer = trainer_class(net.collect_params(), "sgd", opt, kvstore=store,
                                update_on_kvstore=False, **extra)
        run = Run(net, trainer, list(devices), store.rank)
        if name == "load_parameters":
            actions(run, path)
        else:
            actions(run)
        settle()
        names = list(net.collect_params().keys())
        finals[net_kind] = [p.data(run.devices[-1]).astype("float64").asnumpy()
                            for p in net.collect_params().values()]
        if net_kind == "bucketed":
            report = {"buckets": len(trainer.buckets), "replans": trainer.replans,
                      "copied": trainer.copied_gradients}
    diffs = _differences(finals["bucketed"], finals["plain"])
    report["max_diff"] = max(diffs)
    report["worst"] = names[int(np.argmax(diffs))]  # to say where a difference lies
    report["plain_twice_diff"] = max(_differences(finals["plain"], finals["plain_again"]))
    report["largest"] = {kind: max(float(np.max(np.abs(a))) for a in arrays)
                         for kind, arrays in finals.items()}
    # BatchNorm's running statistics follow each rank's own batches; the rest must agree
    # across ranks, in both nets: which net's ranks part says where a difference began.
    for net_kind, key in (("bucketed", "params"), ("plain", "plain_params")):
        trained = [a.ravel() for name, a in zip(names, finals[net_kind])
                   if not name.endswith(("running_mean", "running_var"))]
        report[key] = np.concatenate(trained).tolist()
    return report


def main():
    out_dir, names = sys.argv[1], sys.argv[2:] or list(CASES)
    store = mx.kv.create("horovod")
    seen = {f"{name}/{mode}": run_case(name, mode, store, out_dir)
            for name in names for mode in MODES}
    with open(os.path.join(out_dir, f"buckets{store.rank}.json"), "w") as out:
        json.dump({"rank": store.rank, "num_workers": store.num_workers, "cases": seen}, out)


if __name__ == "__main__":
    main()
