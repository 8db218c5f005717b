"""`make bench`: hvdtrain against the plain Horovod loop, measured in one run on this machine.

After the main rows, the step's fixed cost on a small MLP (scripts/bench_small.py: hvdtrain against the
plain Horovod and Gluon loops and MXNet's Estimator with hvd.DistributedTrainer, at 1 and
2 ranks, with and without Dropout; then scripts/bench_step_phases.py: where hvdtrain's step
goes, phase by phase).

For each loop (plain, hvdtrain) and data (synthetic; CIFAR-format binary files generated here,
with augmentation): one rank alone, two ranks under horovodrun, and two independent one-rank
processes at the same time (the denominator of scaling efficiency). Then an instrumented
two-rank run for the share of step time spent in the gradient exchange. The same for
hvdtrain as it was before zero-copy buckets. Then rows for options (--fp16-allreduce,
--compression powersgd, the training recipe's mixing, --no-wd, EMA and clipping) and
ablations (hvdtrain with one of its changes undone), each a two-rank run and its two
independent processes. Then the same comparison on a shaped link (scripts/bench_link.py: 2
ranks in a private network namespace, Gloo over a rate-limited loopback; skipped, saying why,
where ``unshare -n``/``tc`` are unavailable): the plain loop, hvdtrain, --fp16-allreduce,
--accumulate 4 and both, and PowerSGD at ranks 2 and 4 (and with --accumulate 4). Then an
allreduce microbenchmark, the cost of exchanging each step's sample count
(scripts/bench_step_counts.py), PowerSGD's own work against the memory's bandwidth
(scripts/bench_powersgd.py), the training recipe's options in paired blocks of one job
at 32x32 and at 64x64 (scripts/bench_recipe.py), the input-pipeline and memory rows of
scripts/bench_images.py, and resnet50_v1 on 2 ranks from RecordIO against synthetic input
(scripts/bench_input_bound.py), and hvdtrain-predict against ImageRecordIter plus a forward
pass (scripts/bench_predict.py).
Prints one table and writes it as JSON (--json, default runs/bench.json).
Every process runs with one OpenMP thread, as in the figures the issue quotes.
"""
import argparse
import json
import os
import sys

import bench_link
import bench_small
from bench_runs import Results, hold_machine_lock, measure_until_stopped

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
WORKER = [sys.executable, os.path.join(HERE, "bench_worker.py")]
SMALL = [sys.executable, os.path.join(HERE, "bench_small.py")]
PHASES = [sys.executable, os.path.join(HERE, "bench_step_phases.py")]


def horovodrun(np_):
    return [os.path.join(BIN, "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}"]


# Ablations: hvdtrain with one of its changes undone: (data, extra environment, flags).
ABLATIONS = {
    "hvdtrain, MPI spins": ("synthetic", {"OMPI_MCA_mpi_yield_when_idle": "0"}, []),
    "hvdtrain, imperative": ("synthetic", {}, ["--no-hybridize"]),
    "hvdtrain, per-parameter allreduce": ("synthetic", {}, ["--grad-bucket-mb", "0"]),
    "hvdtrain, metrics read every step": ("synthetic", {}, ["--log-interval", "1"]),
    "hvdtrain, no prefetch": ("cifar", {}, ["--data-workers", "0"]),
    "hvdtrain, 2 OpenMP threads per rank": ("synthetic", {"OMP_NUM_THREADS": "2"}, []),
}
# hvdtrain as it was before zero-copy buckets, measured in full beside today's loop.
BEFORE = {
    "hvdtrain, buckets copied (before zero-copy)": ("synthetic", {}, ["--copied-buckets"]),
}
# Options users turn on, measured the same way: --fp16-allreduce, then the training
# recipe's (issue 38: mixing and --no-wd may cost 2%, the EMA and clipping 5%).
# --last-gamma only changes the initial values: it has nothing to measure.
OPTIONS = {
    "hvdtrain, --fp16-allreduce": ("synthetic", {}, ["--fp16-allreduce"]),
    # Its one-host cost (issue 39): the factors' compute against a cheap exchange.
    "hvdtrain, --compression powersgd": ("synthetic", {}, ["--compression", "powersgd"]),
    "hvdtrain, --mixup 0.2": ("synthetic", {}, ["--mixup", "0.2"]),
    "hvdtrain, --cutmix 1.0": ("synthetic", {}, ["--cutmix", "1.0"]),
    "hvdtrain, --no-wd": ("synthetic", {}, ["--no-wd"]),
    "hvdtrain, --ema 0.9999 --ema-every 1": ("synthetic", {}, ["--ema", "0.9999",
                                                               "--ema-every", "1"]),
    "hvdtrain, --ema 0.9999 (every 32 steps)": ("synthetic", {}, ["--ema", "0.9999"]),
    "hvdtrain, --clip-grad-norm 1.0": ("synthetic", {}, ["--clip-grad-norm", "1.0"]),
}


def measure(runs, impl, data, extra, label=None, full=True, rounds=1):
    """Figures for one loop on one kind of data.

    The two-rank run and its two independent processes alternate for `rounds` rounds and
    each keeps its best: other tenants only ever slow a run down, so the best of a few is
    the least disturbed figure. Without `full`, only those two (the figures an ablation is
    judged by); with it, one rank alone and the instrumented run too.
    """
    args = ["--impl", impl, "--data", data] + extra
    together, independent = [], []
    for _ in range(rounds):
        together.append(runs.collect([runs.start(horovodrun(2) + WORKER + args)]))
        independent.append(runs.collect([runs.start(WORKER + args) for _ in range(2)]))
    total = lambda records: sum(r["img_per_sec"] for r in records)  # noqa: E731
    two = max(total(t) for t in together)
    apart = max(total(i) for i in independent)
    row = {
        "impl": label or impl, "data": data, "rounds": rounds,
        "img_per_sec_1": None,
        "img_per_sec_2": two,
        "img_per_sec_per_rank_2": two / 2,
        "independent_2": apart,
        "scaling_efficiency": two / apart,
        "allreduce_share": None,
        "peak_rss_mb": max(r["peak_rss_mb"] for t in together for r in t),
    }
    if full:
        row["img_per_sec_1"] = runs.collect([runs.start(WORKER + args)])[0]["img_per_sec"]
        shares = runs.collect([runs.start(horovodrun(2) + WORKER + args + ["--instrument"])])
        row["allreduce_share"] = max(r["allreduce_share"] for r in shares)
    return row


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(rows):
    head = ("loop", "data", "img/s 1 rank", "img/s 2 ranks", "per rank", "2 independent",
            "scaling eff.", "allreduce share", "peak RSS MB")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join([r["impl"], r["data"], _fmt(r["img_per_sec_1"], ".0f"),
                                 f"{r['img_per_sec_2']:.0f}", f"{r['img_per_sec_per_rank_2']:.0f}",
                                 f"{r['independent_2']:.0f}", f"{r['scaling_efficiency']:.2f}",
                                 _fmt(r["allreduce_share"], ".0%"), f"{r['peak_rss_mb']:.0f}"]))
    return "\n".join("| " + l + " |" for l in lines)


MAX_STEPS = 1000  # the CIFAR files for 2 ranks x (warm-up + steps) x 64 images: 400 MB


def positive_int(text, most=MAX_STEPS):
    """An argparse type: a whole number from 1 to `most`."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {most}, "
                                         f"got {text!r}")
    return value


def parse():
    from hvdtrain.models import ZOO_MODELS  # both loops can build these
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, default=40,
                   help="timed steps per run, after 5 warm-up steps (default: %(default)s)")
    p.add_argument("--model", default="resnet18_v1", choices=list(ZOO_MODELS),
                   metavar="MODEL", help="one of Gluon's model zoo (both loops build it "
                   "from there): " + ", ".join(ZOO_MODELS) + " (default: %(default)s)")
    p.add_argument("--json", default=os.path.join("runs", "bench.json"),
                   help="where the figures go, rewritten after every row so an interrupted "
                        "bench keeps what it measured; its folder is created "
                        "(default: %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=2,
                   help="alternations of the main rows' two-rank and independent runs, best "
                        "kept (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="few steps and one round, for a smoke test")
    bench_link.add_arguments(p)
    args = p.parse_args()
    if args.quick:
        args.steps, args.rounds, args.micro_batches = 4, 1, 4
    return args


def main():
    args = parse()
    lock = hold_machine_lock()  # noqa: F841  (held until the process ends)
    # After the lock: a refused bench must not touch the file of the one running.
    results = Results(args.json, args.steps, args.model)
    results.check_writable()
    load = results.head["load_average_at_start"]
    if load > 0.5 * os.cpu_count():
        print(f"bench: load average {load:.2f} at start: other work is running, and the "
              "figures will be low and noisy", file=sys.stderr)
    measure_until_stopped(lambda tmp, runs: measure_all(args, tmp, runs, results), results,
                          "bench", args.json)
    results.write(complete=True)
    for row in results.rows:
        print(json.dumps(row))
    print()
    print(table(results.rows))
    shaped = [row for row in results.rows if "link" in row]
    if shaped:
        print("\nshaped link (scripts/bench_link.py):")
        print(bench_link.table(shaped))
    print()
    print("allreduce bus bandwidth, 2 ranks (MB/s): bytes | store pushpull | raw hvd.allreduce_")
    for size, store_bw, raw_bw in results.allreduce:
        print(f"  {size / 2**20:7.2f} MiB | {store_bw:9.0f} | {raw_bw:9.0f} | "
              f"ratio {store_bw / raw_bw:.2f}")
    print("\nPowerSGD's own work a step, two processes at once (scripts/bench_powersgd.py):")
    for row in results.powersgd:
        print(f"  {row['model']} rank {row['rank']}: {row['exchange_ms']:.1f} ms over "
              f"{row['compressed_mb']:.1f} MB at {row['bandwidth_gb_s']:.1f} GB/s a pass: "
              f"{row['passes_at_bandwidth']:.1f} passes' time (floor 8)")
    print("\neach step's sample count exchanged (scripts/bench_step_counts.py):")
    for row in results.counts:
        print("  " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in row.items()))
    for recipe in results.recipe:
        print(f"\nthe training recipe's options at {recipe['image_size']}x{recipe['image_size']}, "
              "paired blocks of one 2-rank job (scripts/bench_recipe.py), medians relative to "
              "hvdtrain's own blocks:")
        for option, ratio in recipe["median_relative"].items():
            print(f"  {option}: throughput {ratio:.3f}, CPU time per sample "
                  f"{recipe['median_cpu_relative'][option]:.3f}")
    print("\ninput pipeline, memory, predict, the replica check and the sharded optimizer "
          "state (scripts/bench_images.py, bench_input_bound.py, bench_predict.py, "
          "bench_replica_check.py, bench_shard_optimizer.py, bench_shard_memory.py):")
    for row in results.images:
        print("  " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in row.items()))
    print("\nthe step's fixed cost: a 64-256-256-1 MLP, batch 32 a rank (scripts/bench_small.py):")
    print(bench_small.table([r for r in results.small if r["row"] == "small MLP"]))
    for row in (r for r in results.small if r["row"] == "step phases"):
        print(f"  hvdtrain's step at {row['ranks']} rank(s), {row['step_us']:.0f} us: " + ", ".join(
            f"{phase} {us:.0f}" for phase, us in row["phases_us"].items()))
    print(f"\nwritten to {args.json}")


def small_rows(args, runs, results):
    """The step's fixed cost (issue 64): the small MLP against the plain loops, then where
    hvdtrain's step goes, phase by phase, at 1 and 2 ranks."""
    rounds, steps = (1, 50) if args.quick else (3, 300)
    results.small = bench_small.measure_rows(runs, SMALL, horovodrun, rounds, steps)
    results.write(complete=False)
    for ranks in (0, 2):
        records = runs.collect([runs.start((horovodrun(ranks) if ranks else []) + PHASES + (
            ["--steps", "50"] if args.quick else []))])
        results.small.append(dict(row="step phases", **records[0]))
    results.write(complete=False)


def measure_all(args, tmp, runs, results):
    """Every row, then the allreduce microbenchmark, each added to `results` as it ends."""
    from hvdtrain.data.datasets import write_cifar_files
    # Two ranks each need warm-up + timed steps of 64 images within one pass.
    write_cifar_files(tmp, num_train=max(8192, 2 * 64 * (args.steps + 6)), num_test=64)
    common = ["--steps", str(args.steps), "--model", args.model, "--data-dir", tmp]
    for data in ("synthetic", "cifar"):
        for impl in ("plain", "hvdtrain"):
            results.add(measure(runs, impl, data, common, rounds=args.rounds))
    small_rows(args, runs, results)
    for label, (data, env_extra, flags) in BEFORE.items():
        results.add(measure(runs.with_env(env_extra), "hvdtrain", data, common + flags, label,
                            rounds=args.rounds))
    for label, (data, env_extra, flags) in {**OPTIONS, **ABLATIONS}.items():
        results.add(measure(runs.with_env(env_extra), "hvdtrain", data, common + flags, label,
                            full=False))
    # The shaped link: ResNet-18 at batch 64 (the figures issue 26 asks for), or --model.
    link = argparse.Namespace(rate=args.rate, delay=args.delay, batch_size=64,
                              micro_batches=args.micro_batches, warmup=2, model=args.model,
                              rounds=args.rounds,
                              rows=list(bench_link.ROWS))
    skipped = bench_link.unavailable(args.rate)
    if skipped:
        results.head["shaped_link"] = f"skipped: {skipped}"
        print(f"bench: shaped-link rows skipped: {skipped}", file=sys.stderr)
    else:
        bench_link.link_rows(runs, link, results.add)
    micro = runs.collect([runs.start(horovodrun(2) + [
        sys.executable, os.path.join(HERE, "bench_allreduce.py")])])
    results.allreduce = [r for r in micro if r["rank"] == 0][0]["results"]
    # PowerSGD's own work a step against the memory's bandwidth, two processes at once as
    # the two ranks of a host.
    results.powersgd = runs.collect([runs.start([
        sys.executable, os.path.join(HERE, "bench_powersgd.py"), "--model", args.model])
        for _ in range(2)])
    # What keeps every rank's divisor the same: each step's sample count exchanged.
    counts = runs.collect([runs.start(horovodrun(2) + [
        sys.executable, os.path.join(HERE, "bench_step_counts.py")])])
    results.counts = [r for r in counts if r["rank"] == 0][0]["rows"]
    # The training recipe's options, paired blocks of one job: the OPTIONS rows above, each
    # its own run, are too noisy for the few percent an option costs on a shared machine.
    # At 32x32 (as the rows above) a step computes so little that an option's fixed cost per
    # weight (the EMA's pass, clipping's norm) is at its largest; 64x64 computes 4x more.
    results.recipe = []
    for image_size, steps, rounds in ((32, 32, 4), (64, 8, 4)):
        quick = ["--steps", "4", "--rounds", "1"] if args.quick else [
            "--steps", str(steps), "--rounds", str(rounds)]
        recipe = runs.collect([runs.start(horovodrun(2) + [
            sys.executable, os.path.join(HERE, "bench_recipe.py"), "--model", args.model,
            "--image-size", str(image_size)] + quick)])
        results.recipe.append(recipe[0])
    # Input pipeline (decode + ImageNet transforms at 224) against ImageRecordIter, and
    # peak RSS for a pack 10x larger than another (targets in docs/data.md).
    images = runs.collect([runs.start([sys.executable, os.path.join(HERE, "bench_images.py"),
                                       "--images", "1024", "--threads", "1,2"])])
    results.images = images[0]["rows"]
    results.write(complete=False)
    # What the replica check costs at each epoch's end and save (hashing the model).
    replicas = runs.collect([runs.start(
        [sys.executable, os.path.join(HERE, "bench_replica_check.py")]
        + (["--models", "resnet18_v1", "--rounds", "1"] if args.quick else []))])
    results.images += replicas[0]["rows"]
    results.write(complete=False)
    # --shard-optimizer: the optimizer state a rank holds, its peak RSS and the step time of
    # a 50M-parameter MLP with Adam, sharded and not, side by side (docs/performance.md).
    # Then ResNet-18 with SGD and momentum, at 2 ranks: the step time side by side.
    shard = runs.collect([runs.start(
        [sys.executable, os.path.join(HERE, "bench_shard_optimizer.py")]
        + (["--ranks", "1,2", "--steps", "3"] if args.quick else []))], timeout=3600)
    shard += runs.collect([runs.start(
        [sys.executable, os.path.join(HERE, "bench_shard_optimizer.py"), "--model",
         "resnet18", "--ranks", "2", "--batch", "16"]
        + (["--steps", "3"] if args.quick else []))], timeout=3600)
    results.images += [{"row": "shard optimizer", "model": document["model"],
                        "ranks": row["ranks"], "sharded": row["sharded"],
                        "state_mib_per_rank": max(row["state_bytes_per_rank"]) / 2 ** 20,
                        "peak_rss_mib": max(row["peak_rss_mib_per_rank"]),
                        "step_seconds": row["step_seconds_median"]}
                       for document in shard for row in document["rows"]]
    results.write(complete=False)
    # What a user of --shard-optimizer sees: peak RSS per rank, sharded against unsharded
    # (the same program, flag off), without and with a checkpoint (issue 66's MLP, Adam).
    memory = runs.collect([runs.start(
        [sys.executable, os.path.join(HERE, "bench_shard_memory.py")]
        + (["--steps", "2"] if args.quick else []))], timeout=1800)
    results.images += [{"row": "shard memory", "model": memory[0]["model"],
                        "ranks": row["ranks"], "checkpoint": row["checkpoint"],
                        "peak_rss_mib_unsharded": row["peak_rss_mib_unsharded"],
                        "peak_rss_mib_sharded": row["peak_rss_mib_sharded"],
                        "saved_mib": row["saved_mib"],
                        "state_freed_mib": row["state_freed_mib"]}
                       for row in memory[0]["rows"]]
    results.write(complete=False)
    # Is a run input-bound: resnet50_v1 at 224 on 2 ranks from RecordIO vs synthetic images.
    quick = ["--model", "resnet18_v1", "--steps", "4", "--images", "160", "--rounds", "1"]
    bound = runs.collect([runs.start([sys.executable, os.path.join(HERE, "bench_input_bound.py")]
                                     + (quick if args.quick else []))], timeout=3600)
    results.images += bound[0]["rows"]
    results.write(complete=False)
    # Predicting with an export: hvdtrain-predict against ImageRecordIter + SymbolBlock.
    quick = ["--model", "resnet18_v1", "--images", "32", "--rounds", "1"]
    predict = runs.collect([runs.start([sys.executable, os.path.join(HERE, "bench_predict.py")]
                                       + (quick if args.quick else []))], timeout=3600)
    results.images += predict[0]["rows"]
    results.write(complete=False)


if __name__ == "__main__":
    main()
