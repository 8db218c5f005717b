"""One rank of a program that catches a fit's error and fits again (as MXNet's own tests do
with ``assert_raises``): a handler raises the same error on every rank, then two fits run to
their end. Prints, after each fit, the job-pulse threads still alive on this rank.

Usage: python pulse_program.py (under a launcher)
"""
import threading
import time

import mxnet as mx
from mxnet import gluon

from hvdtrain.estimator import BatchEnd, Estimator
from say import say


class Fail(BatchEnd):
    def batch_end(self, estimator, *args, **kwargs):
        raise ValueError("a handler's error, the same on every rank")


class Slow(BatchEnd):
    """A fit of a few pulse rounds, so that a pulse left behind would meet this fit's."""

    def batch_end(self, estimator, *args, **kwargs):
        time.sleep(0.1)


def pulses():
    return [t.name for t in threading.enumerate() if t.name == "hvdtrain-pulse"]


def main():
    data = gluon.data.DataLoader(gluon.data.ArrayDataset(mx.nd.ones((32, 3)),
                                                         mx.nd.zeros((32,))), batch_size=4)
    net = gluon.nn.Dense(2)
    net.initialize()
    # A stall timeout of 6 s makes the pulse's rounds 1 s apart.
    estimator = Estimator(net, loss=gluon.loss.SoftmaxCrossEntropyLoss(), stall_timeout=6,
                          log_interval=0)
    try:
        estimator.fit(data, epochs=1, event_handlers=[Fail()])
    except ValueError:
        pass
    say(f"rank {estimator.rank} after the failed fit: {pulses()}")
    for number in range(2):
        estimator.fit(data, epochs=2, event_handlers=[Slow()])
        say(f"rank {estimator.rank} after fit {number}: {pulses()}")


if __name__ == "__main__":
    main()
