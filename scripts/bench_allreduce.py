"""Allreduce microbenchmark: the store's pushpull against a raw horovod.mxnet.allreduce_ of
the same bytes. Run under horovodrun with an output prefix; each rank writes PREFIX.rank<R>.json.

Bus bandwidth = 2 (n - 1) / n x bytes / seconds, the figure NCCL's tests report: what each
link carries in a ring allreduce.
"""
import argparse
import json
import os
import time

import mxnet as mx

import hvdtrain

SIZES_MB = (0.25, 1, 4, 16, 44)  # 44 MiB: all of ResNet-18's gradients
REPEATS = 10
ROUNDS = 5


def timed(op, tensor):
    op(tensor)
    mx.nd.waitall()
    start = time.perf_counter()
    for _ in range(REPEATS):
        op(tensor)
    mx.nd.waitall()
    return (time.perf_counter() - start) / REPEATS


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="write PREFIX.rank<R>.json")
    args = parser.parse_args()
    store = hvdtrain.create_store("horovod")
    hvd = store._hvd  # pylint: disable=protected-access
    n = store.num_workers
    results = []
    for size_mb in SIZES_MB:
        count = int(size_mb * 2**20 / 4)
        tensor = mx.nd.ones(count)
        nbytes = count * 4
        # Alternate the two and keep each one's best round, so neither pays for warming
        # up buffers the other then reuses.
        store_runs, raw_runs = [], []
        for _ in range(ROUNDS):
            store_runs.append(timed(lambda t: store.pushpull(f"bench{size_mb}", t), tensor))
            raw_runs.append(timed(lambda t: hvd.allreduce_(t, op=hvd.Sum, name=f"raw{size_mb}"),
                                  tensor))
        store_s, raw_s = min(store_runs), min(raw_runs)
        bus = lambda s: 2 * (n - 1) / n * nbytes / s / 2**20  # noqa: E731
        results.append((nbytes, bus(store_s), bus(raw_s)))
    with open(f"{args.out}.rank{store.rank}.json", "w") as out:
        json.dump({"rank": store.rank, "results": results}, out)
    mx.nd.waitall()
    hvd.shutdown()  # MPI must be finalized, or mpirun calls the exit abnormal
    os._exit(0)


if __name__ == "__main__":
    main()
