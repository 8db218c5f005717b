"""One rank of tests/dist/test_estimator_handlers.py's folder race: every rank makes its
Estimator, then constructs MXNet's own ``CheckpointHandler`` (imported from mxnet, as a
program written for MXNet's Estimator does, in the order of MXNet's fit API tutorial) on a
new shared ``model_dir`` right after a barrier, ROUNDS times.

Usage: handler_folder_program.py OUT_DIR (under a launcher). Writes OUT_DIR/rank<R>.json:
how many constructions raised, and the first error.
"""
import json
import os
import sys

import mxnet as mx
from mxnet.gluon.contrib.estimator import CheckpointHandler

from hvdtrain import create_store
from hvdtrain.estimator import Estimator

ROUNDS = 40


def main():
    out = sys.argv[1]
    store = create_store("horovod", fuse_calls=False)
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    Estimator(net, mx.gluon.loss.L2Loss(), store=store, context=mx.cpu())
    failures, first = 0, None
    for round_ in range(ROUNDS):
        barrier = mx.nd.ones(1)
        store.sum_exact("barrier", barrier)
        barrier.wait_to_read()  # every rank here: the constructions start together
        try:
            CheckpointHandler(model_dir=os.path.join(out, f"ckpt{round_}"),
                              model_prefix="model")
        except OSError as err:
            failures += 1
            first = first or repr(err)
    with open(os.path.join(out, f"rank{store.rank}.json"), "w") as dst:
        json.dump({"failures": failures, "first": first}, dst)


if __name__ == "__main__":
    main()
