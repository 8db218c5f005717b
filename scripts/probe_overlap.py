"""Does a bucket's exchange start before backward ends? (issue 26, point 3)

A probe, not a bench row (scripts/bench_link.py is the bench). Two ranks on the shaped link:

    unshare -n sh -c 'ip link set lo up && tc qdisc add dev lo root tbf rate 1gbit \\
        burst 256kb latency 50ms && "$@"' sh horovodrun --gloo -np 2 -H localhost:2 \\
        python scripts/probe_overlap.py [--steps 6] [--grad-bucket-mb 25]

Each of hvdtrain's steps (hybridized model, zero-copy buckets, Horovod store) is timed
from its start by waits in side threads, so the main thread's calls run as in training:

- ``backward returns``: ``loss.backward()`` returns to Python (whether it only queues work);
- ``backward done``: a tiny op reading the *first* parameter's gradient, queued before
  ``trainer.step``, completes: backward has written its last gradient;
- ``bucket 0 reduced``: the first bucket (the last layers, whose gradients backward writes
  first) has its allreduce's result; the same for the last bucket;
- ``step done``: ``waitall()`` after the update.

If bucket 0 were exchanged while backward still ran, ``bucket 0 reduced`` would come before
``backward done``, or later by less than its transfer time. Rank 0 prints the medians as JSON.
"""
import argparse
import json
import statistics
import threading
import time

import mxnet as mx
from mxnet import autograd, gluon

import horovod.mxnet as hvd
import hvdtrain
from hvdtrain import TrainConfig
from hvdtrain.store.dist import DistContext, share_cpu_threads


def waited(array, into, key):
    """Start a thread that records in `into[key]` when `array` can be read."""
    def wait():
        array.wait_to_read()  # ctypes releases the GIL while MXNet waits
        into[key] = time.perf_counter()
    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18_v1")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--grad-bucket-mb", type=float, default=TrainConfig.grad_bucket_mb)
    args = p.parse_args()
    store = hvdtrain.create_store("horovod")
    dist = DistContext.from_store(store)
    share_cpu_threads(dist.local_size)
    cfg = TrainConfig(dataset="synthetic", model=args.model, batch_size=args.batch_size,
                      seed=0, grad_bucket_mb=args.grad_bucket_mb)
    net = hvdtrain.build_model(args.model, 10)
    devices = [mx.cpu()]
    hvdtrain.initialize(net, devices, (3, 32, 32), cfg.seed, dist.rank, True)
    trainer = hvdtrain.build_trainer(net, cfg, dist)
    hvdtrain.broadcast_parameters(trainer, args.batch_size * dist.num_workers)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    first = next(p for p in trainer._params if p.grad_req != "null")  # pylint: disable=protected-access
    flats = [f[0] for f in trainer._flat_grads]  # pylint: disable=protected-access
    x = mx.nd.random.uniform(shape=(args.batch_size, 3, 32, 32))
    y = mx.nd.array([i % 10 for i in range(args.batch_size)])
    times = []
    for step in range(args.steps + 1):
        mx.nd.waitall()
        t = {"start": time.perf_counter()}
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        t["backward returns"] = time.perf_counter()
        marker = first.list_grad()[0].sum()  # queued before the exchange writes that gradient
        threads = [waited(marker, t, "backward done"),
                   waited(flats[0], t, "bucket 0 reduced"),
                   waited(flats[-1], t, "last bucket reduced")]
        trainer.step(args.batch_size * dist.num_workers)
        t["step() returns"] = time.perf_counter()
        for thread in threads:
            thread.join()
        mx.nd.waitall()
        t["step done"] = time.perf_counter()
        if step:  # the first step sets things up
            times.append({k: v - t["start"] for k, v in t.items() if k != "start"})
    if dist.rank == 0:
        print(json.dumps({
            "model": args.model, "batch_size": args.batch_size, "steps": args.steps,
            "buckets": len(flats), "bucket_mb": [round(f.size * 4 / 2**20, 1) for f in flats],
            "median_seconds_from_step_start": {
                k: round(statistics.median(s[k] for s in times), 3) for k in times[0]}}))
    hvd.shutdown()


if __name__ == "__main__":
    main()
