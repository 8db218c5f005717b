"""Is a run input-bound? `hvdtrain` on 2 ranks from a RecordIO pack of ImageNet-like JPEGs
(about 500x375, decoded and augmented at 224) against the same run on synthetic images of
224 pixels (``--dataset synthetic --image-size 224``: no decoding, no augmentation).

Usage: python scripts/bench_input_bound.py --out PREFIX [--images 512] [--model resnet50_v1]
       [--batch-size 8] [--steps 12] [--rounds 2]

Each run stops after ``--steps`` steps (``--max-steps``); its throughput is taken between
the progress lines of steps WARMUP and ``--steps`` (``--log-interval``), so the first
steps' graph building and the loader's first batch count on neither side. The two sides
alternate for ``--rounds`` rounds and each keeps its best.
Writes PREFIX.rank0.json (``{"rank": 0, "rows": [...]}``) as scripts/bench.py reads it.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from bench_images import make_images

BIN = os.path.dirname(sys.executable)
WARMUP = 2  # steps left out of the figure
# hvdtrain's progress line: samples/s (global) since the epoch's first step.
PROGRESS = re.compile(r"step (\d+)/\d+ .* ([\d.]+) samples/s \(global\)")


def run_rate(flags, output_dir, args):
    """Global samples/s of one 2-rank `hvdtrain` run stopped after `args.steps` steps."""
    cmd = [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2",
           os.path.join(BIN, "hvdtrain"), "--no-cuda", "--model", args.model,
           "--batch-size", str(args.batch_size), "--max-steps", str(args.steps),
           "--epochs", "1", "--log-interval", str(WARMUP), "--output-dir", output_dir] + flags
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"bench_input_bound: a run failed (exit {proc.returncode}): "
                 f"{' '.join(cmd)}\n{proc.stdout[-3000:]}")
    # Cumulative rates: step k's line says k * global_batch / t_k.
    seconds = {int(step): int(step) * 2 * args.batch_size / float(rate)
               for step, rate in PROGRESS.findall(proc.stdout)}
    if WARMUP not in seconds or args.steps not in seconds:
        sys.exit(f"bench_input_bound: no progress line for step {WARMUP} or {args.steps}:\n"
                 f"{proc.stdout[-3000:]}")
    return (args.steps - WARMUP) * 2 * args.batch_size / (seconds[args.steps] - seconds[WARMUP])


def main():
    from hvdtrain.data.pack import pack_folder
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--model", default="resnet50_v1")
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.steps <= WARMUP or args.steps % WARMUP:
        sys.exit(f"bench_input_bound: --steps must be a multiple of {WARMUP} above it")
    if args.images < 2 * args.batch_size * (args.steps + 1):
        sys.exit("bench_input_bound: --images must cover 2 ranks x --batch-size x "
                 "(--steps + 1), so that the run stops inside its first epoch")
    best = {"recordio": 0.0, "synthetic": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        folder, pack = os.path.join(tmp, "images"), os.path.join(tmp, "pack")
        make_images(folder, args.images)
        pack_folder(folder, pack)
        sides = {"recordio": ["--dataset", "recordio", "--data-dir", pack],
                 "synthetic": ["--dataset", "synthetic", "--image-size", "224"]}
        for round_ in range(args.rounds):
            for side, flags in sides.items():
                rate = run_rate(flags, os.path.join(tmp, f"{side}-{round_}"), args)
                best[side] = max(best[side], rate)
    row = {"row": f"{args.model} at 224, 2 ranks, RecordIO vs synthetic",
           "recordio_img_s": best["recordio"], "synthetic_img_s": best["synthetic"],
           "ratio": best["recordio"] / best["synthetic"], "batch_size_per_rank": args.batch_size,
           "steps": args.steps, "rounds": args.rounds}
    with open(args.out + ".rank0.json", "w") as out:
        json.dump({"rank": 0, "rows": [row]}, out, indent=1)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
