"""What the replica check costs (hvdtrain/loop/run/replica_check.py): each rank's own work at
an epoch's end or a save, copying every array of the model and its optimizer state to host
memory and hashing it, for the models of the bench; the collective that follows carries two
float64 numbers per array and rank.

    python scripts/bench_replica_check.py [--models resnet18_v1,resnet50_v1] [--rounds 5]

One process, no store. Prints one JSON object: {"rows": [...]}, a row per model with the
megabytes hashed, the arrays compared and the median seconds of one check.
"""
import argparse
import json
import statistics
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from hvdtrain.loop.run.replica_check import local_digests, model_replicas
from hvdtrain.models import build_model


def one_model(name, rounds):
    net = build_model(name, classes=10)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1,
                                                          "momentum": 0.9})
    with autograd.record():  # one step: the shapes and the momentum exist
        loss = net(mx.nd.random.uniform(shape=(2, 3, 32, 32))).sum()
    loss.backward()
    trainer.step(2)
    mx.nd.waitall()
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        replicas = model_replicas(net, trainer)
        local_digests(replicas)
        seconds.append(time.perf_counter() - start)
    size = sum(a.size * np.dtype(a.dtype).itemsize
               for r in replicas for a in r.arrays)
    return {"row": "replica check", "model": name, "arrays": len(replicas),
            "megabytes_hashed": size / 2 ** 20, "seconds_median": statistics.median(seconds)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18_v1,resnet50_v1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="also write the rows to OUT.rank0.json (the bench's "
                                      "record format: scripts/bench.py)")
    args = parser.parse_args()
    document = json.dumps({"rows": [one_model(m, args.rounds)
                                    for m in args.models.split(",")]})
    print(document)
    if args.out:
        with open(args.out + ".rank0.json", "w") as out:
            out.write(document)


if __name__ == "__main__":
    main()
