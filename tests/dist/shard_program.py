"""One job of tests/dist/test_shard_optimizer.py: a tiny MLP trained by the Estimator with
and without ``shard_optimizer``, for each optimizer and with or without one rank's whole
first step unusable, every case from the same start.

Usage: shard_program.py OUT_DIR [CHECKPOINTS_OF_2]. Writes OUT_DIR/rank<R>.npz (each case's final arrays as
``<case>:<param>``, and the start as ``start:<param>``; cases named ``<optimizer>-<unusable>-<sharded>``) and OUT_DIR/rank<R>.json
(per case: optimizer-state bytes and elements this rank holds, the model's elements, steps,
the bytes of each buffer of the sharded exchange and of the largest parameter).

Checkpoints, for RESUMED optimizers: at 2 ranks, an unsharded run of EPOCHS epochs saves
at each epoch's end and a sharded one every 4 steps (inside the epochs: steps 4 and 8; and
at the end), in OUT_DIR/ckpt-<optimizer>-<sharded>; a sharded run resumes the sharded run's
checkpoint of step 8 (case ``<optimizer>-resumed-1``); with Adam, a sharded run stopped at
step 9 (``max_steps``: the stop's save, as a signal's) and resumed (``adam-stopped-1``). At 3 ranks (CHECKPOINTS_OF_2: the
2-rank job's OUT_DIR), a sharded and an unsharded run resume the 2-rank sharded run's last
checkpoint for one more epoch (cases ``<optimizer>-from2-<sharded>``), and a sharded one the
unsharded's (``<optimizer>-from2plain-1``).

BatchNorm and a frozen layer (``bn-1-<sharded>``, Adam, one rank's first step unusable).
COMBINED: Adam with --accumulate 2, with --clip-grad-norm (one rank's first step unusable),
with --ema (its average saved as ``ema.<param>``) and with the float16 wire, sharded and not.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from estimator_models import BATCH, Unusable, first_step_of_last_rank  # noqa: E402
sys.path.insert(0, os.path.dirname(HERE))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()  # GluonNLP lives apart from the venv
import gluonnlp  # noqa: E402,F401  (registers its optimizer 'bertadam')
from hvdtrain import create_store  # noqa: E402
from hvdtrain.estimator import Estimator  # noqa: E402
from hvdtrain.store.sharded import ShardedTrainer  # noqa: E402

TRAIN, FEATURES, EPOCHS, SEED = 96, 10, 2, 5
TINY_FEATURES = 300  # its weight (1200 bytes) is a bucket of its own
# Several buckets of at most 1 KiB (256 float32): slices that cut parameters and span them.
BUCKET_MB = 1 / 1024
OPTIMIZERS = {
    "sgd": ("sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}),
    "nag": ("nag", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}),
    "adam": ("adam", {"learning_rate": 0.01, "wd": 1e-3}),
    "lamb": ("lamb", {"learning_rate": 0.01, "wd": 1e-3}),
    # GluonNLP's BERT optimizer (registered by importing gluonnlp): Adam, decoupled decay.
    "bertadam": ("bertadam", {"learning_rate": 0.01, "wd": 1e-3}),
}


def make_net(tiny=False, bn=False):
    """The MLP; `tiny`: one Dense(1) of 300 inputs instead, whose bias (1 element) is a
    bucket of its own, smaller than the ranks (some rank's slice of it is empty); `bn`: a
    frozen Dense(24) (grad_req 'null'), BatchNorm, ReLU and Dense(3) instead."""
    if bn:
        net = gluon.nn.HybridSequential(prefix="bnmlp_")
        with net.name_scope():
            net.add(gluon.nn.Dense(24, in_units=FEATURES), gluon.nn.BatchNorm(in_channels=24),
                    gluon.nn.Activation("relu"), gluon.nn.Dense(3, in_units=24))
        net.initialize(mx.init.Xavier())
        net[0].collect_params().setattr("grad_req", "null")  # frozen, as a fine-tune's
        return net
    # One prefix for every instance: the Trainer orders parameters by name, and a resumed
    # state is matched to them by that order (counted prefixes past 99 sort differently).
    net = gluon.nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        if tiny:
            net.add(gluon.nn.Dense(1, in_units=TINY_FEATURES))
        else:
            net.add(gluon.nn.Dense(24, activation="relu", in_units=FEATURES),
                    gluon.nn.Dense(24, activation="tanh", in_units=24),
                    gluon.nn.Dense(3, in_units=24))
    net.initialize(mx.init.Xavier())
    if tiny:
        return net
    params = net._collect_params_with_prefix()  # pylint: disable=protected-access
    # Per-parameter multipliers: a slice spanning parameters must apply each one's own.
    params["0.weight"].lr_mult = 0.5
    params["1.weight"].wd_mult = 3.0
    for name, param in params.items():
        if name.endswith("bias"):
            param.wd_mult = 0.0
    return net


def make_data(tiny=False):
    rng = np.random.default_rng(SEED)
    if tiny:
        x = rng.normal(size=(TRAIN, TINY_FEATURES)).astype(np.float32)
        return gluon.data.ArrayDataset(mx.nd.array(x), mx.nd.array(x[:, :1] + 1))
    x = rng.normal(size=(TRAIN, FEATURES)).astype(np.float32)
    y = np.stack([x[:, :3].sum(1), np.tanh(x[:, 3:6]).sum(1), x[:, 6] * x[:, 7]], 1)
    return gluon.data.ArrayDataset(mx.nd.array(x), mx.nd.array(y.astype(np.float32)))


RESUMED = ("sgd", "adam", "lamb")
INSIDE = "checkpoints/epoch-0001-step-0000008"  # the sharded run's, inside epoch 2
LAST = f"checkpoints/epoch-{EPOCHS:04d}"


def run_case(store, start, optimizer, unusable, sharded, tiny=False, epochs=EPOCHS,
             bn=False, **options):
    net = make_net(tiny, bn)
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(start[name])
    name, params = OPTIMIZERS[optimizer]
    trainer = gluon.Trainer(net.collect_params(), name, dict(params))
    estimator = Estimator(net, gluon.loss.L2Loss(), trainer=trainer, store=store,
                          shard_optimizer=sharded, grad_bucket_mb=BUCKET_MB,
                          max_bad_samples="20%", seed=SEED, **options)
    train = make_data(tiny)
    if unusable:
        train = Unusable(train, first_step_of_last_rank(
            len(train), estimator.num_workers, True, estimator.config.seed, 1))
    estimator.fit(gluon.data.DataLoader(train, batch_size=BATCH, shuffle=True),
                  epochs=epochs)
    arrays = {k: p.data().asnumpy()
              for k, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    if estimator.ema is not None:
        arrays.update({f"ema.{k}": np.asarray(v) for k, v in estimator.ema.state().items()})
    info = {"steps": estimator.state.step,
            "elements": sum(int(a.size) for a in arrays.values())}
    if isinstance(estimator.trainer, ShardedTrainer):
        info["state_bytes"] = estimator.trainer.state_bytes()
        info["state_elements"] = sum(
            int(a.size) for state in estimator.trainer.shard_updater.states.values()
            for a in (state if isinstance(state, (list, tuple)) else [state])
            if a is not None)
        info["buckets"] = len(estimator.trainer.buckets)
        info["pieces"] = sum(len(p) for p in estimator.trainer.pieces)
        info["exchange_buffer_bytes"] = estimator.trainer.exchange_buffer_bytes()
        info["largest_parameter_bytes"] = max(4 * int(a.size) for a in arrays.values())
    return arrays, info


# With the run's other options (Adam): cases named <option>-<unusable>-<sharded>. The
# clipping's limit is below the gradients' norms here (the test sees it change the result).
COMBINED = {"accumulate": (0, dict(accumulate=2)),
            "clip": (1, dict(clip_grad_norm=0.05)),
            "ema": (0, dict(ema=0.9)),
            "fp16": (0, dict(fp16_allreduce=True))}


def checkpoint_cases(store, start, out, of_two):
    """The resume cases (see the module's docstring): {case: (arrays, info)}."""
    cases = {}
    for optimizer in RESUMED:
        if of_two is None:
            for sharded in (False, True):
                cases[f"{optimizer}-saved-{int(sharded)}"] = run_case(
                    store, start, optimizer, 0, sharded,
                    output_dir=os.path.join(out, f"ckpt-{optimizer}-{int(sharded)}"),
                    checkpoint_every="4steps" if sharded else 1, keep_checkpoints=10)
            cases[f"{optimizer}-resumed-1"] = run_case(
                store, start, optimizer, 0, True,
                resume=os.path.join(out, f"ckpt-{optimizer}-1", INSIDE))
            if optimizer == "adam":  # a stop's save (max_steps: the path a signal takes)
                stopped = os.path.join(out, "ckpt-adam-stop")
                run_case(store, start, optimizer, 0, True, output_dir=stopped, max_steps=9)
                cases["adam-stopped-1"] = run_case(
                    store, start, optimizer, 0, True, output_dir=stopped, resume="auto")
            continue
        for sharded, source, case in ((True, 1, "from2-1"), (False, 1, "from2-0"),
                                      (True, 0, "from2plain-1")):
            cases[f"{optimizer}-{case}"] = run_case(
                store, start, optimizer, 0, sharded, epochs=EPOCHS + 1,
                resume=os.path.join(of_two, f"ckpt-{optimizer}-{source}", LAST))
    return cases


def main():
    out = sys.argv[1]
    of_two = sys.argv[2] if len(sys.argv) > 2 else None
    store = create_store("horovod", fuse_calls=False)
    mx.random.seed(SEED)
    first = make_net()
    # The same on every rank, and each fit broadcasts rank 0's anyway.
    start = {k: p.data().copy()
             for k, p in first._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    saved = {f"start:{k}": v.asnumpy() for k, v in start.items()}
    infos = {}
    for optimizer in OPTIMIZERS:
        for unusable in (0, 1):
            for sharded in (False, True):
                case = f"{optimizer}-{unusable}-{int(sharded)}"
                arrays, infos[case] = run_case(store, start, optimizer, unusable, sharded)
                saved.update({f"{case}:{k}": v for k, v in arrays.items()})
    # The other nets, Adam, each from a start of its own: (name, unusable, make_net's kind).
    for net_name, unusable, kind in (("tiny", 0, {"tiny": True}), ("bn", 1, {"bn": True})):
        mx.random.seed(SEED)
        other = {k: p.data().copy() for k, p in  # pylint: disable=protected-access
                 make_net(**kind)._collect_params_with_prefix().items()}
        saved.update({f"start-{net_name}:{k}": v.asnumpy() for k, v in other.items()})
        for sharded in (False, True):
            case = f"{net_name}-{unusable}-{int(sharded)}"
            arrays, infos[case] = run_case(store, other, "adam", unusable, sharded, **kind)
            saved.update({f"{case}:{k}": v for k, v in arrays.items()})
    half_store = create_store("horovod", compression="fp16", fuse_calls=False)
    for option, (unusable, options) in COMBINED.items():
        for sharded in (False, True):
            case = f"{option}-{unusable}-{int(sharded)}"
            arrays, infos[case] = run_case(half_store if options.get("fp16_allreduce")
                                           else store, start, "adam", unusable, sharded,
                                           **options)
            saved.update({f"{case}:{k}": v for k, v in arrays.items()})
    for case, (arrays, infos[case]) in checkpoint_cases(store, start, out, of_two).items():
        saved.update({f"{case}:{k}": v for k, v in arrays.items()})
    np.savez(os.path.join(out, f"rank{store.rank}.npz"), **saved)
    with open(os.path.join(out, f"rank{store.rank}.json"), "w") as f:
        json.dump({"rank": store.rank, "ranks": store.num_workers, "cases": infos}, f)


if __name__ == "__main__":
    main()
