"""The cost of each option of the training recipe, measured in one job, paired.

    horovodrun -np 2 -H localhost:2 python scripts/bench_recipe.py --out PREFIX

On a shared machine two separate runs differ by more than the few percent an option costs
(make bench's OPTIONS rows, each its own run, were 0.6x to 1.9x of hvdtrain's own row on a
busy machine). Here one 2-rank job trains hvdtrain's loop in blocks of `--steps` steps,
each block with one option turned on (none, for the reference), in an order that rotates
every round, and compares each block with the reference block of the same round. Two
figures per block: its throughput (wall clock), and the CPU time the process spent per
sample (all its threads: ``getrusage``), which other tenants of the machine disturb far
less: on a CPU-bound host, an option's cost in CPU time per sample is its cost in
throughput. Rank 0 writes PREFIX.rank0.json: per option, each round's figures relative to
the reference and their medians.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import mxnet as mx

import hvdtrain
from hvdtrain import TrainConfig
from hvdtrain.data.datasets import SYNTHETIC_SIZE, make_synthetic
from hvdtrain.loop.recipe.clipping import GradClipper
from hvdtrain.loop.recipe.ema import WeightAverage
from hvdtrain.classify.build import classifier_loop
from hvdtrain.loop.engine.epoch import train_epoch
from hvdtrain.loop.recipe.mixing import Mixing
from hvdtrain.loop.engine.weight_decay import undecayed_params
from hvdtrain.models import ModelError, check_model_name
from hvdtrain.state.train_state import TrainState
from hvdtrain.store.dist import DistContext, share_cpu_threads

VARIANTS = ("reference", "--mixup 0.2", "--cutmix 1.0", "--no-wd",
            "--ema 0.9999 --ema-every 1", "--ema 0.9999", "--clip-grad-norm 1.0")


def parse():
    # The first paragraph: what it measures and how to launch it.
    what, launch = (part.strip() for part in __doc__.split("\n\n")[:2])
    p = argparse.ArgumentParser(description=f"{what} Run it as: {launch}")
    p.add_argument("--model", default="resnet18_v1", help="model (default resnet18_v1)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="batch per rank (default 64)")
    # 32 as make bench's other rows: the worst case for options whose cost is per weight
    # (the EMA, clipping's norm), which do not grow with the image as the step does.
    p.add_argument("--image-size", type=int, default=SYNTHETIC_SIZE,
                   help=f"side of the synthetic images (default {SYNTHETIC_SIZE})")
    # 32: every block of --ema 0.9999 (every 32 steps) holds one update of the average.
    p.add_argument("--steps", type=int, default=32, help="steps per block (default 32)")
    p.add_argument("--rounds", type=int, default=4, help="blocks per option (default 4)")
    p.add_argument("--out", required=True, help="write PREFIX.rank0.json")
    args = p.parse_args()
    for flag in ("batch_size", "image_size", "steps", "rounds"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    try:
        check_model_name(args.model)
    except ModelError as err:
        p.error(f"--model: {err}")
    return args


def cpu_seconds():
    """User and system CPU time of this process so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def turn_on(loop, variant, net, dist, classes):
    """Set `loop` up for `variant` (and undo every other variant)."""
    loop.processor.mixing = loop.clipper = loop.ema = None
    exempt = undecayed_params(net)
    for param in exempt["normalisation"] + exempt["bias"]:
        param.wd_mult = 0.0 if variant == "--no-wd" else 1.0
    if variant.startswith("--mixup"):
        loop.processor.mixing = Mixing(0.2, 0.0, None, 0, classes)
    elif variant.startswith("--cutmix"):
        loop.processor.mixing = Mixing(0.0, 1.0, None, 0, classes)
    elif variant.startswith("--ema"):
        loop.ema = WeightAverage(net, 0.9999, 1 if "every" in variant else 32)
    elif variant.startswith("--clip"):
        loop.clipper = GradClipper(1.0, net, dist)


def main():
    args = parse()
    store = hvdtrain.create_store("horovod")
    dist = DistContext.from_store(store)
    share_cpu_threads(dist.local_size)
    cfg = TrainConfig(dataset="synthetic", model=args.model, batch_size=args.batch_size,
                      seed=0)
    data = make_synthetic(num_train=dist.num_workers * args.batch_size * (args.steps + 2),
                          num_test=16, image_size=args.image_size)
    net = hvdtrain.build_model(args.model, data.num_classes)
    devices = [mx.cpu()]
    hvdtrain.initialize(net, devices, data.image_shape, cfg.seed, dist.rank)
    trainer = hvdtrain.build_trainer(net, cfg, dist)
    hvdtrain.broadcast_parameters(trainer, args.batch_size * dist.num_workers)
    loader, _ = hvdtrain.build_loaders(data, cfg, dist)
    # The step count runs on over the blocks, as over a run (it decides --ema-every's updates).
    state = TrainState()
    loop = classifier_loop(net, trainer, devices, dist, state)
    rates = {variant: [] for variant in VARIANTS}
    cpu = {variant: [] for variant in VARIANTS}  # CPU seconds per sample
    turn_on(loop, "reference", net, dist, data.num_classes)
    loop.max_steps = 3
    train_epoch(loop, loader, state)  # warm-up: graphs, buckets, allocations
    for number in range(args.rounds):
        order = VARIANTS[number % len(VARIANTS):] + VARIANTS[:number % len(VARIANTS)]
        for variant in order:
            turn_on(loop, variant, net, dist, data.num_classes)
            state.step = -(-state.step // args.steps) * args.steps  # blocks start aligned
            loop.max_steps = state.step + args.steps
            mx.nd.waitall()
            start, used = time.perf_counter(), cpu_seconds()
            stats = train_epoch(loop, loader, state)
            mx.nd.waitall()
            rates[variant].append(stats.samples / (time.perf_counter() - start))
            cpu[variant].append((cpu_seconds() - used) / (stats.samples / dist.num_workers))
    relative = {variant: [r / base for r, base in zip(rates[variant], rates["reference"])]
                for variant in VARIANTS}
    # Above 1: the option costs that much more CPU time per sample.
    cpu_relative = {variant: [c / base for c, base in zip(cpu[variant], cpu["reference"])]
                    for variant in VARIANTS}
    if dist.rank == 0:
        with open(f"{args.out}.rank0.json", "w") as out:
            json.dump({"model": args.model, "batch_size": args.batch_size,
                       "image_size": args.image_size, "ranks":
                       dist.num_workers, "steps": args.steps, "img_per_sec": rates,
                       "relative": relative,
                       "median_relative": {v: statistics.median(r) for v, r in relative.items()},
                       "cpu_seconds_per_sample": cpu, "cpu_relative": cpu_relative,
                       "median_cpu_relative": {v: statistics.median(r)
                                               for v, r in cpu_relative.items()},
                       "load_average": os.getloadavg()[0]}, out, indent=1)
    mx.nd.waitall()
    import horovod.mxnet as hvd  # pylint: disable=import-outside-toplevel
    hvd.shutdown()
    sys.stdout.flush()
    os._exit(0)  # skip MXNet's teardown, which can take seconds


if __name__ == "__main__":
    main()
