"""One rank of a replica check over models that differ in size between the ranks (rank r's
Dense has 2 + r units): every rank prints the check's one line and exits with its status
(issue 63, finding 6).

Usage: replica_sizes_program.py (under a launcher)
"""
import os

import mxnet as mx
from mxnet import gluon

from hvdtrain import create_store
from hvdtrain.loop.run.replica_check import ReplicaCheck
from hvdtrain.loop.run.together import StoppedTogether
from hvdtrain.store.dist import DistContext
from say import say


def main():
    dist = DistContext.from_store(create_store("horovod"))
    net = gluon.nn.Dense(2 + dist.rank, in_units=3)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    try:
        ReplicaCheck(net, trainer, dist, "resync").verify("the test's check")
    except StoppedTogether as stop:
        say(stop.line)
        stop.leave()
        os._exit(stop.status)  # pylint: disable=protected-access
    mx.nd.waitall()
    say("no difference found")


if __name__ == "__main__":
    main()
