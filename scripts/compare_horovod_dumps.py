#!/usr/bin/env python3
"""Read what scripts/run_horovod_scripts.py --dump wrote: do the ranks hold one model?

Usage: scripts/compare_horovod_dumps.py DIR [--against REF_DIR]

For DIR (one 2-rank run): after each epoch, how many of the trainer's arrays differ between
rank 0 and each other rank (bit for bit), split into running statistics (arrays no gradient
updates: names ending in running_mean/running_var/moving_*) and the rest, with the largest
difference; and each rank's steps/s and CPU seconds a step (from its second step on: the first builds
the graph).

With --against REF_DIR (the same script, seed and data under the other module): whether the
initial arrays are equal, and the largest difference between the two runs' first updates
(step1 - step0 on rank 0) over the weights, beside the largest update itself.
"""
import argparse
import glob
import json
import os
import re
import sys

import numpy as np

STATS = re.compile(r"(running_mean|running_var|moving_mean|moving_var)$")


def load(folder, rank, label):
    path = os.path.join(folder, f"rank{rank}-{label}.npz")
    with np.load(path) as arrays:
        return {name: arrays[name] for name in arrays.files}


def ranks(folder):
    found = glob.glob(os.path.join(folder, "rank*-steps.json"))
    return sorted(int(re.search(r"rank(\d+)-", os.path.basename(p)).group(1)) for p in found)


def differing(first, other):
    """(names of differing running statistics, of other arrays, largest difference)."""
    stats, rest, worst = [], [], 0.0
    for name, array in first.items():
        if not np.array_equal(array, other[name]):
            (stats if STATS.search(name) else rest).append(name)
            worst = max(worst, float(np.abs(array.astype(np.float64) - other[name]).max()))
    return stats, rest, worst


def report_run(folder):
    all_ranks = ranks(folder)
    steps = {r: json.load(open(os.path.join(folder, f"rank{r}-steps.json"))) for r in all_ranks}
    epochs = len(steps[all_ranks[0]]["epoch_ends"])
    for epoch in range(epochs):
        first = load(folder, all_ranks[0], f"epoch{epoch}")
        n_stats = sum(1 for name in first if STATS.search(name))
        for rank in all_ranks[1:]:
            stats, rest, worst = differing(first, load(folder, rank, f"epoch{epoch}"))
            print(f"epoch {epoch}: rank 0 vs {rank}: {len(stats)} of {n_stats} running "
                  f"statistics and {len(rest)} of {len(first) - n_stats} other arrays differ "
                  f"(largest difference {worst:.3g})")
    for rank in all_ranks:
        times = steps[rank]["times"]
        if len(times) > 2:
            rate = (len(times) - 2) / (times[-1] - times[1])
            cpu = steps[rank].get("cpu")
            per_step = f", {(cpu[-1] - cpu[1]) / (len(cpu) - 2):.3f} CPU s/step" if cpu else ""
            print(f"rank {rank}: {len(times)} steps, {rate:.3f} steps/s{per_step} from step 2 on")


def report_against(folder, ref):
    start, start_ref = load(folder, 0, "step0"), load(ref, 0, "step0")
    _, rest, worst = differing(start, start_ref)
    print(f"initial arrays: {len(rest)} weights differ between the runs (largest {worst:.3g})")
    after, after_ref = load(folder, 0, "step1"), load(ref, 0, "step1")
    gap = biggest = 0.0
    for name in start:
        if STATS.search(name):
            continue
        update = after[name].astype(np.float64) - start[name]
        update_ref = after_ref[name].astype(np.float64) - start_ref[name]
        gap = max(gap, float(np.abs(update - update_ref).max()))
        biggest = max(biggest, float(np.abs(update_ref).max()))
    print(f"first update: largest difference {gap:.3g} (largest update {biggest:.3g})")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--against", metavar="REF_DIR")
    args = parser.parse_args(argv)
    if not ranks(args.folder):
        print(f"compare_horovod_dumps.py: error: {args.folder} holds no rank*-steps.json",
              file=sys.stderr)
        return 2
    report_run(args.folder)
    if args.against:
        report_against(args.folder, args.against)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
