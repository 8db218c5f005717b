"""One rank of an ``evaluate()`` called without ``fit``, on weights that differ by rank (each
rank initialised its net from its own seed; Gluon defers the shapes to the first batch), as
a program that loads or builds a model and scores it would.

Usage: python evaluate_program.py OUT_DIR [replica_check=...] [val=N] (under a launcher)

An error is one line, ``evaluate_program.py: error: ...``, and exit status 2 (bad input) or 1.

Writes OUT_DIR/rank<R>.npz (every array after evaluate()) and OUT_DIR/rank<R>.json (the
RMSE and validation count this rank reports).
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import regression  # noqa: E402
from hvdtrain.estimator import Estimator  # noqa: E402
from say import say  # noqa: E402

VAL, BATCH = 37, 8


def main():
    try:
        run()
    except (ValueError, RuntimeError) as err:
        say(f"evaluate_program.py: error: {err}")
        getattr(err, "leave", lambda: None)()
        os._exit(getattr(err, "status", 1))  # pylint: disable=protected-access


def run():
    out = sys.argv[1]
    options = dict(a.split("=", 1) for a in sys.argv[2:])
    samples = int(options.pop("val", VAL))
    net = regression.make_net()
    estimator = Estimator(net, gluon.loss.L2Loss(), val_metrics=[mx.metric.RMSE()], **options)
    mx.random.seed(100 + estimator.rank)  # each rank its own weights
    net.initialize(mx.init.Xavier())
    val = gluon.data.ArrayDataset(*regression.make_data(samples, 2))
    estimator.evaluate(gluon.data.DataLoader(val, batch_size=BATCH))
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays)
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump({"rmse": float(estimator.val_metrics[0].get()[1]),
                   "val_count": estimator.val_count}, dump)


if __name__ == "__main__":
    main()
