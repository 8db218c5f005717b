"""What keeping each step's sample count global costs: hvdtrain's training loop
(``loop.epoch.train_epoch``) on 2 ranks with the count exchanged every step (as for a streamed
loader, which can leave unusable samples out, and, carrying the save and stop vote, for every
run of the ``hvdtrain`` command but ``--elastic``) against the same loop without it (an
in-memory loader in a loop with no vote: ``--elastic``, and every in-memory run before issue
37), and the latency of the exchange alone when nothing overlaps it.

Run under horovodrun with an output prefix; each rank writes PREFIX.rank<R>.json:

    horovodrun -np 2 -H localhost:2 python scripts/bench_step_counts.py --out PREFIX

The batches are random arrays already in memory (no decoding), so the step is as short as the
model makes it and the exchange's share is as large as it gets. The two sides alternate for
--rounds rounds and each keeps its best step time.
"""
import argparse
import json
import time

import mxnet as mx
import numpy as np

import hvdtrain
from hvdtrain.config import TrainConfig
from hvdtrain.classify.build import build_trainer, classifier_loop, initialize
from hvdtrain.loop.engine.epoch import train_epoch
from hvdtrain.loop.engine.trainer import broadcast_parameters
from hvdtrain.loop.engine.guard import FiniteGuard
from hvdtrain.models import build_model
from hvdtrain.state.train_state import TrainState
from hvdtrain.store.dist import DistContext


class ArrayLoader:
    """`steps` batches of random images; with `streamed`, it says it can leave samples out
    (a ``skipped`` list, as the image loader has), which makes the loop exchange counts."""

    def __init__(self, steps, batch_size, shape, streamed):
        rng = np.random.default_rng(0)
        self.batch_size = batch_size
        self.sampler = range(steps * batch_size)
        self.images = rng.standard_normal((batch_size,) + shape).astype(np.float32)
        self.labels = rng.integers(0, 10, batch_size).astype(np.int32)
        if streamed:
            self.skipped = []

    def __len__(self):
        return len(self.sampler) // self.batch_size

    def __iter__(self):
        for _ in range(len(self)):
            yield self.images, self.labels


def step_seconds(loop, streamed, steps, batch_size, shape):
    loader = ArrayLoader(steps, batch_size, shape, streamed)
    train_epoch(loop, ArrayLoader(2, batch_size, shape, streamed), TrainState())  # warm-up
    mx.nd.waitall()
    start = time.perf_counter()
    train_epoch(loop, loader, TrainState())
    mx.nd.waitall()
    return (time.perf_counter() - start) / steps


def exchange_latency(dist, repeats=200):
    """Seconds of one count exchange waited for at once (nothing to overlap it)."""
    counts = mx.nd.array([8, 0])
    dist.sum_across_workers("latency", counts).asnumpy()
    start = time.perf_counter()
    for _ in range(repeats):
        dist.sum_across_workers("latency", mx.nd.array([8, 0])).asnumpy()
    return (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="write PREFIX.rank<R>.json")
    parser.add_argument("--model", default="resnet18_v1")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = TrainConfig(dataset="synthetic", model=args.model, batch_size=args.batch_size,
                      no_cuda=True)
    dist = DistContext.from_store(hvdtrain.create_store("horovod"))
    shape = (3, args.image_size, args.image_size)
    net = build_model(args.model, 10)
    initialize(net, [mx.cpu()], shape, cfg.seed, dist.rank)
    trainer = build_trainer(net, cfg, dist)
    broadcast_parameters(trainer, args.batch_size * dist.num_workers)
    loop = classifier_loop(net, trainer, [mx.cpu()], dist, TrainState(),
                           guard=FiniteGuard(dist, mx.cpu(), cfg.finite_check_every))
    best = {True: float("inf"), False: float("inf")}
    for _ in range(args.rounds):
        for streamed in (False, True):
            best[streamed] = min(best[streamed], step_seconds(loop, streamed, args.steps,
                                                              args.batch_size, shape))
    row = {"row": f"count exchange, {args.model} at {args.image_size} px, 2 ranks, batch "
                  f"{args.batch_size}", "step_ms_without": 1e3 * best[False],
           "step_ms_with": 1e3 * best[True],
           "cost_ratio": best[True] / best[False] - 1,
           "exchange_alone_ms": 1e3 * exchange_latency(dist)}
    with open(f"{args.out}.rank{dist.rank}.json", "w") as out:
        json.dump({"rank": dist.rank, "rows": [row]}, out, indent=1)
    if dist.rank == 0:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
