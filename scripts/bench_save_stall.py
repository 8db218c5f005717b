"""What a checkpoint costs the training steps around it: written before training goes on
(``Checkpointer`` without a host copy, as hvdtrain saved until issue 37) against copied to host
memory and written in the background (as hvdtrain saves now).

One process, no store: the same model, optimizer (SGD with momentum) and checkpointer the
``hvdtrain`` command uses, on random images already in memory. Each round trains --warmup
steps, then --steps steps with one save after the first of them, once each way; every step
is timed to the host (``waitall``), and the save call itself (what training waits for).

    python scripts/bench_save_stall.py --model resnet50_v1 --out save_stall.json

Prints one JSON object per way and writes them all to --out.
"""
import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from hvdtrain.loop.run.boundary import host_copy
from hvdtrain.models import build_model
from hvdtrain.state.checkpoint import Checkpointer
from hvdtrain.state.train_state import TrainState


def step(net, trainer, loss_fn, images, labels):
    with autograd.record():
        loss = loss_fn(net(images), labels)
    loss.backward()
    trainer.step(images.shape[0])
    mx.nd.waitall()


def one_way(net, trainer, loss_fn, batch, background, steps, folder):
    """Step times around one save (the save after step 1), the save call, and the write."""
    saver = Checkpointer(folder, every=None, keep=2, host_copy=host_copy if background else None)
    times, save_call, written = [], None, None
    for index in range(steps):
        start = time.perf_counter()
        step(net, trainer, loss_fn, *batch)
        times.append(time.perf_counter() - start)
        if index == 0:
            start = time.perf_counter()
            saver.save(net, trainer, TrainState(epoch=0, step=index + 1, epoch_samples=8))
            save_call = time.perf_counter() - start
            write_started = time.perf_counter()
        if background and written is None and not saver.writing:
            written = time.perf_counter() - write_started
    saver.wait()
    if written is None:
        written = time.perf_counter() - write_started if background else save_call
    files = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]
    return {"way": "background" if background else "before training goes on",
            "save_call_s": save_call, "write_s": written,
            "state_mb": sum(os.path.getsize(f) for f in files if "latest" not in f) / 1e6,
            "step_s": times}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50_v1")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dir", help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    net = build_model(args.model, 1000)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                          "momentum": 0.9})
    rng = np.random.default_rng(0)
    batch = (mx.nd.array(rng.standard_normal((args.batch_size, 3, args.image_size,
                                              args.image_size))),
             mx.nd.array(rng.integers(0, 1000, args.batch_size)))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(args.warmup):
        step(net, trainer, loss_fn, *batch)
    rows = []
    for _ in range(args.rounds):
        for background in (False, True):
            folder = tempfile.mkdtemp(prefix="save-stall-", dir=args.dir)
            try:
                row = one_way(net, trainer, loss_fn, batch, background, args.steps, folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            steps = row.pop("step_s")
            quiet = steps[-4:]  # the write is long done by then
            row.update(model=args.model, image_size=args.image_size, batch=args.batch_size,
                       step_ms_quiet=1e3 * statistics.median(quiet),
                       step_ms_around_save=[round(1e3 * t) for t in steps],
                       stall_ms=1e3 * row["save_call_s"],
                       extra_ms_while_writing=1e3 * (sum(steps[1:-4]) - (len(steps) - 5) *
                                                      statistics.median(quiet)))
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(args.out, "w") as out:
        json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
