"""PowerSGD's own work a step, against this machine's memory bandwidth: a row of `make bench`.

    python scripts/bench_powersgd.py [--model resnet18_v1] [--rank 4] [--steps 30] [--out PREFIX]

One process, no collective: the buckets of a model's gradients are planned as the Trainer
plans them (25 MiB, the compressed matrices in buckets of their own), and each step runs
PowerSGD's exchange of every compressed bucket through a store that sums nothing (two
workers' worth of arithmetic, none of their traffic). What it prints:

- the memory bandwidth of one pass over the compressed gradients (a copy reads and writes
  each number: two passes), measured here, now;
- PowerSGD's time a step, as the ``o`` of docs/performance.md without the collectives;
- that time in passes over the compressed gradients at the measured bandwidth: the memory
  floor of the exchange is its passes (eight: ``E += G``, ``M Q``, ``M^T P``, ``P Q^T``
  into the gradient, the error in place) times one pass; what lies above is arithmetic
  and the operators' own overheads.

Every process runs with one OpenMP thread unless OMP_NUM_THREADS says otherwise, as two
ranks on two cores do in `make bench`, which starts two of these at once (two ranks of one
host share its memory). ``--out PREFIX`` writes the figures to ``PREFIX.rank0.json``.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hvdtrain.models import build_model  # noqa: E402
from hvdtrain.store.bucket_plan import plan_buckets  # noqa: E402
from hvdtrain.store.powersgd import PowerSGD  # noqa: E402

BUCKET_BYTES = 25 * 2 ** 20


class SumsNothing:
    """A store of two workers whose collectives leave every array as it is."""

    num_workers = 2

    def pushpull(self, key, value, out=None, priority=0):  # pylint: disable=unused-argument
        pass


def gradients(model: str, image_size: int):
    """The model's gradients (zeros), in the Trainer's parameter order."""
    net = build_model(model, 10)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, image_size, image_size)))
    return [mx.nd.zeros(p.shape) for p in net.collect_params().values()
            if p.grad_req != "null"]


def plan(grads, compression):
    """Flat buffers and views, as BucketedTrainer makes them; the compressed buckets."""
    kinds = [compression.compresses(g.shape) for g in grads]
    entries = []
    for bucket in plan_buckets([g.size * 4 for g in grads], BUCKET_BYTES, kinds):
        if not kinds[bucket[0]]:
            continue
        flat = mx.nd.zeros(sum(grads[i].size for i in bucket))
        views, at = [], 0
        for i in bucket:
            views.append((i, flat[at:at + grads[i].size].reshape(grads[i].shape)))
            at += grads[i].size
        entries.append((flat, views))
    return [bucket for bucket in compression.plan(entries, SumsNothing()) if bucket]


def seconds(work, steps: int) -> float:
    work()
    mx.nd.waitall()
    start = time.perf_counter()
    for _ in range(steps):
        work()
    mx.nd.waitall()
    return (time.perf_counter() - start) / steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18_v1")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", help="write the figures to OUT.rank0.json")
    args = p.parse_args()
    compression = PowerSGD(args.rank, start_step=0, seed=0)
    buckets = plan(gradients(args.model, args.image_size), compression)
    rng = np.random.default_rng(0)
    for bucket in buckets:
        bucket.flat[:] = mx.nd.array(rng.normal(size=bucket.flat.shape) * 1e-3)
    numbers = sum(m.grad.size for b in buckets for m in b.matrices)
    pass_bytes = numbers * 4

    def step():
        compression.start_step_exchange()
        for index, bucket in enumerate(buckets):
            compression.exchange(bucket, f"bucket.{index}", 1.0 / 128)
        compression.finish_step()

    source = mx.nd.array(rng.normal(size=numbers))
    target = mx.nd.zeros(numbers)
    copy = seconds(lambda: source.copyto(target), args.steps)
    bandwidth = 2 * pass_bytes / copy  # a copy reads and writes every number
    exchange = seconds(step, args.steps)
    figures = {"model": args.model, "rank": args.rank, "matrices": sum(
        len(b.matrices) for b in buckets), "compressed_mb": pass_bytes / 1e6,
        "bandwidth_gb_s": bandwidth / 1e9, "exchange_ms": exchange * 1e3,
        "passes_at_bandwidth": exchange * bandwidth / pass_bytes,
        "threads": os.environ["OMP_NUM_THREADS"]}
    print(f"PowerSGD rank {args.rank} on {args.model}'s gradients: {figures['matrices']} "
          f"matrices, {figures['compressed_mb']:.1f} MB compressed; one pass over them at "
          f"{figures['bandwidth_gb_s']:.1f} GB/s (a copy, {figures['threads']} thread(s)) "
          f"takes {pass_bytes / bandwidth * 1e3:.2f} ms; the exchange's own work "
          f"{figures['exchange_ms']:.1f} ms a step = {figures['passes_at_bandwidth']:.1f} "
          f"passes' time (8 passes are its memory floor)")
    if args.out:
        with open(f"{args.out}.rank0.json", "w") as out:
            json.dump(figures, out)


if __name__ == "__main__":
    main()
