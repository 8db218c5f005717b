"""What ``--shard-optimizer`` saves and costs: optimizer-state bytes and peak RSS per rank
of a ~50M-parameter MLP trained with Adam at 1, 2 and 3 ranks, with and without sharding,
and the step time side by side (``--model resnet18``: Gluon's ResNet-18 with SGD and
momentum instead). Prints one JSON document.

    python scripts/bench_shard_optimizer.py [--steps 10] [--ranks 1,2,3] [--batch 32]
                                            [--model mlp|resnet18]

It starts each job itself (``mpirun --oversubscribe -np N`` of this script with
``--worker``), one after another. A worker trains the MLP (1024 -> 4096 -> 4096 -> 4096 ->
3072 -> 10, 50.4M parameters, float32) on random data with a BucketedTrainer (25 MiB
buckets) or a ShardedTrainer over the horovod store, and reports: the optimizer state it
holds (bytes of the arrays of its updater), its peak RSS (``ru_maxrss``) after the steps,
and the median time of a whole step (forward, backward, exchange and update, waited for)
over ``--steps`` steps after two of warm-up. Every rank runs one OpenMP thread.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAYERS = (1024, 4096, 4096, 4096, 3072, 10)
# Each model with the optimizer it is usually trained with.
OPTIMIZERS = {"mlp": ("adam", {"learning_rate": 1e-4}),
              "resnet18": ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})}


def worker(args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, ROOT)
    import mxnet as mx
    from mxnet import autograd, gluon

    from hvdtrain import broadcast_parameters
    from hvdtrain.store.buckets import BucketedTrainer
    from hvdtrain.store.kvstore import HorovodKVStore
    from hvdtrain.store.sharded import ShardedTrainer, state_bytes

    store = HorovodKVStore(fuse_calls=False)
    mx.random.seed(1)
    if args.model == "resnet18":
        from mxnet.gluon.model_zoo import vision
        net = vision.resnet18_v1(classes=10)
        shape = (args.batch, 3, 32, 32)
    else:
        net = gluon.nn.HybridSequential()
        for units, inputs in zip(LAYERS[1:], LAYERS[:-1]):
            net.add(gluon.nn.Dense(units, in_units=inputs,
                                   activation="relu" if units != LAYERS[-1] else None))
        shape = (args.batch, LAYERS[0])
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros(shape))  # every shape known before the trainer plans its buckets
    net.hybridize(static_alloc=True, static_shape=True)
    kind = ShardedTrainer if args.sharded else BucketedTrainer
    optimizer, settings = OPTIMIZERS[args.model]
    trainer = kind(net.collect_params(), optimizer, settings, kvstore=store,
                   update_on_kvstore=False, bucket_mb=25.0)
    # The store and buckets set up before the first backward pass: the static graph then
    # writes its gradients into the buckets (no copies).
    broadcast_parameters(trainer, args.batch * store.num_workers)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.normal(shape=shape)
    y = mx.nd.array([i % LAYERS[-1] for i in range(args.batch)])
    times = []
    for step in range(args.steps + 2):
        start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch * store.num_workers)
        mx.nd.waitall()
        if step >= 2:
            times.append(time.perf_counter() - start)
    states = trainer.shard_updater.states if args.sharded else trainer._updaters[0].states
    report = {"rank": store.rank, "ranks": store.num_workers, "sharded": args.sharded,
              "parameters": sum(p.data().size for p in net.collect_params().values()),
              "state_bytes": state_bytes(states),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "step_seconds_median": statistics.median(times)}
    with open(os.path.join(args.out, f"rank{store.rank}.json"), "w") as out:
        json.dump(report, out)


def run_job(ranks: int, sharded: bool, args) -> list:
    with tempfile.TemporaryDirectory() as out:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-np", str(ranks), "-x", "PATH", "-x", "OMP_NUM_THREADS=1",
               sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
               "--steps", str(args.steps), "--batch", str(args.batch),
               "--model", args.model]
        cmd += ["--sharded"] if sharded else []
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ranks", default="1,2,3")
    parser.add_argument("--model", choices=sorted(OPTIMIZERS), default="mlp",
                        help="mlp: the 50.4M-parameter MLP with Adam; resnet18: Gluon's "
                             "resnet18_v1 (11.2M parameters, 10 classes) on 32x32 images "
                             "with SGD and momentum")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sharded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write the document to OUT.rank0.json (the "
                                      "bench's record format: scripts/bench.py)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    for ranks in (int(n) for n in args.ranks.split(",")):
        for sharded in (False, True):
            reports = run_job(ranks, sharded, args)
            rows.append({"ranks": ranks, "sharded": sharded,
                         "parameters": reports[0]["parameters"],
                         "state_bytes_per_rank": [r["state_bytes"] for r in reports],
                         "peak_rss_mib_per_rank": [round(r["peak_rss_bytes"] / 2 ** 20)
                                                   for r in reports],
                         "step_seconds_median": max(r["step_seconds_median"]
                                                    for r in reports)})
    document = json.dumps({"machine": f"{os.cpu_count()} cores, {os.uname().machine}",
                           "date": time.strftime("%Y-%m-%d", time.gmtime()),
                           "model": args.model, "optimizer": OPTIMIZERS[args.model][0],
                           "batch_per_rank": args.batch,
                           "steps_timed": args.steps, "rows": rows}, indent=1)
    print(document)
    if args.out:  # scripts/bench.py's record (a worker's --out is its folder instead)
        with open(args.out + ".rank0.json", "w") as out:
            out.write(document)


if __name__ == "__main__":
    main()
