"""One rank of an ``evaluate()`` whose metric is gathered over the ranks (MXNet's PCC: its
confusion matrices travel as bytes, ``metric_records``), for the fault test
(test_agree_faults.py): an error is printed in one line,
``metric_fault_program.py: error: ...``, exit 1.

Usage: python metric_fault_program.py (under a launcher)
"""
import os

import mxnet as mx
import numpy as np
from mxnet import gluon

from hvdtrain.estimator import Estimator
from say import say


def main():
    net = gluon.nn.Dense(2, in_units=2)
    net.initialize(mx.init.Xavier())
    rng = np.random.default_rng(5)
    x = rng.normal(size=(24, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    estimator = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(),
                          val_metrics=[mx.metric.PCC()], log_interval=0)
    try:
        estimator.evaluate(gluon.data.DataLoader(gluon.data.ArrayDataset(x, y),
                                                 batch_size=4))
    except RuntimeError as err:
        say(f"metric_fault_program.py: error: {err}")
        getattr(err, "leave", lambda: None)()
        os._exit(1)  # pylint: disable=protected-access
    say(f"metric_fault_program.py: pcc {estimator.val_metrics[0].get()[1]:.4f}")


if __name__ == "__main__":
    main()
