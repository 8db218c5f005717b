#!/usr/bin/env python3
"""GluonCV's Horovod scripts at 2 ranks under horovod.mxnet and hvdtrain.horovod, side by side.

Usage: scripts/bench_horovod_scripts.py UPSTREAM DATA [--pairs 3] [--jobs resnet18_v1,...]

UPSTREAM holds ``gluoncv/imagenet/train_horovod.py`` and ``gluoncv/ssd/train_ssd.py`` as
GluonCV 0.10 has them (docs/horovod-field.md: fetch them there), DATA what
scripts/horovod_field_data.py writes. Each job (``resnet18_v1`` and ``mobilenet1.0`` on
train_horovod.py, ``ssd`` on train_ssd.py, and ``ssd-apart``: the same with each rank
seeded apart, ``HVDFIELD_SEED_PER_RANK=1``, not run unless named) runs ``--pairs`` times under each module, the two
alternating (which goes first alternates too), through scripts/run_horovod_scripts.py with
the measurement hook and one seed. Prints a line per run (load, exit status, steps/s and
CPU seconds a step of rank 0 from its second step, the arrays differing between the ranks
after the last epoch) and per job the medians and the median of the pairs' speed ratios.
The docs' figures (docs/horovod-field.md) come from these command lines.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare_horovod_dumps import STATS, differing, load  # noqa: E402

MODULES = ("horovod.mxnet", "hvdtrain.horovod")


def job_args(job, data):
    """(folder under UPSTREAM, file, the script's arguments, mpirun's -x ones) of `job`."""
    if job in ("ssd", "ssd-apart"):
        apart = ["-x", "HVDFIELD_SEED_PER_RANK=1"] if job == "ssd-apart" else []
        return ("gluoncv/ssd", "train_ssd.py",
                ["--horovod", "--network", "mobilenet0.25", "--data-shape", "300",
                 "--dataset", "voc", "--dataset-root", data, "--batch-size", "8", "-j", "0",
                 "--epochs", "2", "--log-interval", "0", "--save-interval", "0",
                 "--val-interval", "1"], apart)
    rec = os.path.join(data, "digits-rec")
    return ("gluoncv/imagenet", "train_horovod.py",
            ["--rec-train", os.path.join(rec, "train.rec"),
             "--rec-val", os.path.join(rec, "val.rec"), "--model", job, "--no-cuda",
             "--batch-size", "16", "--num-epochs", "3", "--warmup-epochs", "0",
             "--input-size", "64", "--data-nthreads", "0", "--eval-frequency", "1",
             "--save-frequency", "0", "--log-interval", "0"], ["-x", "HVDFIELD_CLASSES=10"])


def run_once(job, module, upstream, data, dumps):
    folder, name, args, exported = job_args(job, data)
    cmd = ["mpirun", "--bind-to", "none", "-np", "2", "-x", "PATH", *exported]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    cmd += [sys.executable, os.path.join(HERE, "run_horovod_scripts.py"), "--module", module,
            "--dump", dumps, "--seed", "1", os.path.join(upstream, folder), name, *args]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=1800, check=False)
    result = {"rc": proc.returncode, "load": (load_before, os.getloadavg()[0])}
    if proc.returncode == 0:
        with open(os.path.join(dumps, "rank0-steps.json")) as src:
            steps = json.load(src)
        times, cpu = steps["times"], steps["cpu"]
        result["rate"] = (len(times) - 2) / (times[-1] - times[1])
        result["cpu"] = (cpu[-1] - cpu[1]) / (len(cpu) - 2)
        last = f"epoch{len(steps['epoch_ends']) - 1}"
        stats, rest, _ = differing(load(dumps, 0, last), load(dumps, 1, last))
        arrays = load(dumps, 0, last)
        n_stats = sum(1 for key in arrays if STATS.search(key))
        result["differ"] = f"{len(stats)}/{n_stats} statistics, {len(rest)}/" \
                           f"{len(arrays) - n_stats} other"
    return result


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("upstream")
    parser.add_argument("data")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--jobs", default="resnet18_v1,mobilenet1.0,ssd")
    args = parser.parse_args(argv)
    for job in args.jobs.split(","):
        results = {module: [] for module in MODULES}
        for pair in range(args.pairs):
            for module in (MODULES if pair % 2 == 0 else MODULES[::-1]):
                with tempfile.TemporaryDirectory(prefix="horovod-bench-") as dumps:
                    got = run_once(job, module, args.upstream, args.data, dumps)
                results[module].append(got)
                print(f"{job} {module} pair {pair}: load {got['load'][0]:.1f}-"
                      f"{got['load'][1]:.1f}, exit {got['rc']}"
                      + (f", {got['rate']:.3f} steps/s, {got['cpu']:.3f} CPU s/step, "
                         f"after the last epoch {got['differ']} differ" if "rate" in got
                         else ""), flush=True)
        ok = [(a, b) for a, b in zip(*results.values()) if "rate" in a and "rate" in b]
        if ok:
            medians = [statistics.median(r[k] for r in pair_side) for pair_side in zip(*ok)
                       for k in ("rate", "cpu")]
            ratio = statistics.median(b["rate"] / a["rate"] for a, b in ok)
            print(f"{job}: {len(ok)} pairs; steps/s {medians[0]:.3f} horovod.mxnet, "
                  f"{medians[2]:.3f} hvdtrain.horovod (median of the pairs' ratios "
                  f"{ratio:.2f}); CPU s/step {medians[1]:.3f} and {medians[3]:.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
