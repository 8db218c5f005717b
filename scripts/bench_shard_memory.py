"""Peak RSS per rank, ``shard_optimizer`` on and off, with and without a checkpoint: what a
user of ``--shard-optimizer`` sees (issue 66). Prints one JSON document.

    python scripts/bench_shard_memory.py [--ranks 2,3] [--steps 6] [--batch 32]

The model is issue 66's MLP: 256 inputs, Dense(4096), Dense(4096) (a 4096x4096 weight: 94%
of the 17.9M parameters, one bucket alone), Dense(16), Adam, trained for ``--steps`` steps
(one epoch) through ``hvdtrain.Estimator`` on random data. Four jobs a world size, one after
another (``mpirun --oversubscribe -np N`` of this script with ``--worker``): the same program with
``shard_optimizer`` off and on, each without an output folder and with one (a checkpoint
written at the epoch's end). Each rank reports its peak RSS (``ru_maxrss``) at the end, the
RSS it had before ``fit`` (the model and the data made), and the optimizer-state bytes it
holds; a row's ``saved_mib`` is the unsharded job's peak minus the sharded job's, rank by
rank, against ``state_freed_mib``: the (1 - 1/N) of Adam's state a rank no longer holds.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INPUTS, HIDDEN, OUTPUTS = 256, 4096, 16


def rss_mib() -> float:
    with open("/proc/self/statm") as src:
        return int(src.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def worker(args) -> None:
    sys.path.insert(0, ROOT)
    import mxnet as mx
    import numpy as np
    from mxnet import gluon

    from hvdtrain import create_store
    from hvdtrain.estimator import Estimator
    from hvdtrain.store.shard_state import state_bytes

    store = create_store("horovod", fuse_calls=False)
    mx.random.seed(1)
    net = gluon.nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(gluon.nn.Dense(HIDDEN, activation="relu", in_units=INPUTS),
                gluon.nn.Dense(HIDDEN, activation="relu", in_units=HIDDEN),
                gluon.nn.Dense(OUTPUTS, in_units=HIDDEN))
    net.initialize(mx.init.Xavier())
    samples = args.steps * args.batch * store.num_workers
    rng = np.random.default_rng(0)
    data = gluon.data.ArrayDataset(
        mx.nd.array(rng.normal(size=(samples, INPUTS)).astype(np.float32)),
        mx.nd.array(rng.integers(0, OUTPUTS, size=samples).astype(np.float32)))
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-4})
    options = {"output_dir": os.path.join(args.out, "run")} if args.save else {}
    estimator = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer,
                          store=store, shard_optimizer=args.sharded, seed=1, **options)
    before = rss_mib()
    estimator.fit(gluon.data.DataLoader(data, batch_size=args.batch), epochs=1)
    mx.nd.waitall()
    trained = estimator.trainer
    states = trained.shard_updater.states if args.sharded else trained._updaters[0].states
    report = {"rank": store.rank, "steps": estimator.state.step,
              "parameters": sum(p.data().size for p in net.collect_params().values()),
              "state_bytes": state_bytes(states), "rss_before_fit_mib": before,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with open(os.path.join(args.out, f"rank{store.rank}.json"), "w") as out:
        json.dump(report, out)


def run_job(ranks: int, sharded: bool, save: bool, args) -> list:
    with tempfile.TemporaryDirectory() as out:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-np", str(ranks), "-x", "PATH", "-x", "OMP_NUM_THREADS=1",
               sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
               "--steps", str(args.steps), "--batch", str(args.batch)]
        cmd += (["--sharded"] if sharded else []) + (["--save"] if save else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return [json.load(open(os.path.join(out, f"rank{r}.json")))
                for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ranks", default="2,3", help="world sizes, comma-separated")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sharded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write the document to OUT.rank0.json (the "
                                      "bench's record format: scripts/bench.py)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    for ranks, save in ((int(n), save) for n in args.ranks.split(",") for save in (False, True)):
        plain, sharded = run_job(ranks, False, save, args), run_job(ranks, True, save, args)
        rows.append({
            "checkpoint": save, "ranks": ranks, "parameters": plain[0]["parameters"],
            "peak_rss_mib_unsharded": [round(r["peak_rss_mib"]) for r in plain],
            "peak_rss_mib_sharded": [round(r["peak_rss_mib"]) for r in sharded],
            "saved_mib": [round(p["peak_rss_mib"] - s["peak_rss_mib"])
                          for p, s in zip(plain, sharded)],
            "state_freed_mib": [round((p["state_bytes"] - s["state_bytes"]) / 2 ** 20)
                                for p, s in zip(plain, sharded)],
            "rss_before_fit_mib": [round(r["rss_before_fit_mib"]) for r in plain + sharded]})
    document = json.dumps({"machine": f"{os.cpu_count()} cores, {os.uname().machine}",
                           "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                           "load": os.getloadavg()[0], "model": "mlp 256-4096-4096-16",
                           "optimizer": "adam", "batch_per_rank": args.batch,
                           "steps": args.steps, "rows": rows}, indent=1)
    print(document)
    if args.out:  # scripts/bench.py's record
        with open(args.out + ".rank0.json", "w") as out:
            out.write(document)


if __name__ == "__main__":
    main()
