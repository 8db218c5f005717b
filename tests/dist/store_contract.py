"""MXNet's KVStore contract, exercised on one store: run under a launcher (horovod) or as
one process (MXNet's local and device stores).

Usage: python store_contract.py STORE[,STORE...] OUT_DIR
Writes OUT_DIR/<STORE>.store<R>.json for each STORE, run one after the other (MXNet's stores
share one process that way): for each case, what this rank saw; test_store_contract.py holds
what it must see. Each rank contributes values built from its rank, so every sum is known.
Keys are used once per store for broadcast (MXNet's stores initialise a key with it) and
then reduced; int and str keys each get a store of their own (MXNet's stores refuse to mix).
"""
import json
import os
import sys

import mxnet as mx
import numpy as np

import hvdtrain  # noqa: F401  registers 'horovod'
from hvdtrain.store.dist import DistContext

LARGE = 1 << 22  # 16 MiB of float32: above Horovod's fusion threshold and MXNet's bigarray bound
DEVICES = [mx.cpu(0), mx.cpu(1)]


def values(arrays):
    return [a.asnumpy().tolist() for a in arrays]


def span(array):
    """Min and max: a large array is summarised, not dumped."""
    return [float(array.min().asscalar()), float(array.max().asscalar())]


def contract_cases(store, rank, key):
    """Run every case of the contract with keys made by `key(n)`; return what was seen."""
    seen = {}
    ones = mx.nd.ones
    # broadcast: rank 0's value reaches every out, each copy on its own device
    value = ones(4) * (100 + rank)
    store.broadcast(key(0), value, out=value)
    seen["broadcast"] = value.asnumpy().tolist()
    copies = [mx.nd.zeros(2, ctx=d) for d in DEVICES]
    store.broadcast(key(1), ones(2) * (100 + rank), out=copies)
    seen["broadcast_copies"] = values(copies) + [[str(c.context) for c in copies]]
    for n in range(2, 9):  # every key below is set up once, as a Trainer does
        shape = LARGE if n in (7, 8) else (3 if n in (3, 4) else 2)
        store.broadcast(key(n), mx.nd.zeros(shape), out=mx.nd.zeros(shape))
    # pushpull in place
    value = mx.nd.array([rank + 1.0, 10.0])
    store.pushpull(key(2), value)
    seen["inplace"] = value.asnumpy().tolist()
    # pushpull with out: the value is left as it was
    value, out = ones(3) * (rank + 1), mx.nd.zeros(3)
    store.pushpull(key(3), value, out=out)
    seen["out"], seen["out_value"] = out.asnumpy().tolist(), value.asnumpy().tolist()
    # a list of keys, in place and with outs
    pair = [ones(3) * (rank + 1), ones(2) * 2]
    store.pushpull([key(4), key(5)], pair)
    seen["keys_inplace"] = values(pair)
    pair, outs = [ones(3) * (rank + 1), ones(2) * 2], [mx.nd.zeros(3), mx.nd.zeros(2)]
    store.pushpull([key(4), key(5)], pair, out=outs)
    seen["keys_out"], seen["keys_out_value"] = values(outs), values(pair)
    # several device copies of one key: summed over copies and ranks
    copies = [ones(2, ctx=DEVICES[0]) * rank, ones(2, ctx=DEVICES[1])]
    store.pushpull(key(6), copies)
    seen["copies_inplace"] = values(copies) + [[str(c.context) for c in copies]]
    copies = [ones(2, ctx=DEVICES[0]) * rank, ones(2, ctx=DEVICES[1])]
    outs = [mx.nd.zeros(2, ctx=d) for d in DEVICES]
    store.pushpull(key(6), copies, out=outs)
    seen["copies_out"], seen["copies_out_value"] = values(outs), values(copies)
    # large arrays
    big = ones(LARGE) * (rank + 1)
    store.pushpull(key(7), big)
    seen["large_inplace"] = span(big)
    big, out = ones(LARGE) * (rank + 1), mx.nd.zeros(LARGE)
    store.pushpull(key(8), big, out=out)
    seen["large_out"], seen["large_out_value"] = span(out), span(big)
    return seen


def horovod_extras(store, rank):
    """What only the horovod store has: names that cannot be confused, and compression."""
    seen = {}
    # The same key broadcast and reduced back to back must not be matched with each other.
    weight, grad = mx.nd.ones(4) * (100 + rank), mx.nd.ones(4)
    store.broadcast("same", weight, [weight])
    store.pushpull("same", grad)
    seen["same_key"] = [weight.asnumpy().tolist(), grad.asnumpy().tolist()]
    fp16 = hvdtrain.create_store("horovod", compression="fp16")
    compressed, again = mx.nd.array([1.0001]), mx.nd.array([2.0001])
    fp16.pushpull("fp16", compressed)
    fp16.pushpull("fp16", again)  # the same key's wire buffer, reused
    value, out = mx.nd.array([1.0001]), mx.nd.zeros(1)
    fp16.pushpull("fp16_out", value, out=out)
    seen["fp16"] = [float(compressed.asscalar()), str(compressed.dtype), float(again.asscalar()),
                    float(out.asscalar()), float(value.asscalar())]
    # A broadcast is a sum with zeros from the other ranks (store/broadcast.py): whatever
    # they held, NaN or integers, they end with rank 0's values exactly.
    held = mx.nd.array([0.1, -0.0, 3e38]) if rank == 0 else mx.nd.array([np.nan, 7, np.inf])
    counts = mx.nd.array([2**40 + 1, -5] if rank == 0 else [9, 9], dtype="int64")
    store.broadcast("held", held, held)
    store.broadcast("counts", counts, counts)
    seen["broadcast_exact"] = [held.asnumpy().tobytes().hex(), counts.asnumpy().tolist()]
    # Bookkeeping beside compressed gradients is exact, even beyond float16's 65,504.
    totals = mx.nd.array([70000.5 + rank, 3001.0, 1e6])
    DistContext.from_store(fp16).sum_across_workers("totals", totals)
    seen["exact_totals"] = totals.asnumpy().astype("float64").tolist()
    return seen


def check_store(name, out_dir):
    int_store, str_store = mx.kv.create(name), mx.kv.create(name)
    rank = int_store.rank
    seen = {"rank": rank, "num_workers": int_store.num_workers, "type": int_store.type}
    for kind, store, key in (("int", int_store, lambda n: n),
                             ("str", str_store, lambda n: f"key{n}")):
        for case, result in contract_cases(store, rank, key).items():
            seen[f"{kind}.{case}"] = result
    if name == "horovod":
        seen.update(horovod_extras(int_store, rank))
    with open(os.path.join(out_dir, f"{name}.store{rank}.json"), "w") as dump:
        json.dump(seen, dump)


def main():
    names, out_dir = sys.argv[1], sys.argv[2]
    for name in names.split(","):
        check_store(name, out_dir)


if __name__ == "__main__":
    main()
