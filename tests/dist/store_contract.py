"""The store contract across ranks: run under a launcher; writes OUT_DIR/store<R>.json."""
import json
import os
import sys

import mxnet as mx

import hvdtrain  # noqa: F401  registers 'horovod'


def main():
    store = mx.kv.create("horovod")
    rank = store.rank
    single = mx.nd.array([rank + 1.0, 10.0])
    store.pushpull("single", single)
    copies = [mx.nd.ones(2) * rank, mx.nd.ones(2)]
    out = mx.nd.zeros(2)
    store.pushpull("copies", copies, out=out)
    grouped = [mx.nd.ones(3) * (rank + 1), mx.nd.ones(1) * 2]
    store.pushpull(["g1", "g2"], grouped)
    weight = mx.nd.ones(4) * (100 + rank)
    # The same key broadcast and reduced back to back must not be confused.
    grad = mx.nd.ones(4)
    store.broadcast(0, weight, [weight])
    store.pushpull(0, grad)
    compressed, again = mx.nd.array([1.0001]), mx.nd.array([2.0001])
    fp16 = hvdtrain.create_store("horovod", compression="fp16")
    fp16.pushpull("fp16", compressed)
    fp16.pushpull("fp16", again)  # the same key's wire buffer, reused
    with open(os.path.join(sys.argv[1], f"store{rank}.json"), "w") as dump:
        json.dump({"rank": rank, "num_workers": store.num_workers,
                   "single": single.asnumpy().tolist(), "copies": out.asnumpy().tolist(),
                   "grouped": [g.asnumpy().tolist() for g in grouped],
                   "weight": weight.asnumpy().tolist(), "grad": grad.asnumpy().tolist(),
                   "fp16": [float(compressed.asscalar()), str(compressed.dtype),
                            float(again.asscalar())]}, dump)


if __name__ == "__main__":
    main()
