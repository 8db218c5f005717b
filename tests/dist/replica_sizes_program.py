"""One rank of a replica check over models that differ in size between the ranks (rank r's
Dense has 2 + r units): every rank prints the check's one line and exits with its status
(issue 63, finding 6).

Usage: replica_sizes_program.py [values] (under a launcher)

``values``: the sizes are alike and the values differ (each rank initialised its own), as
the fault test (test_agree_faults.py) needs to reach the check's value and gap sums; a
failure there (``HVDTRAIN_FAULT_AT``) is printed in one line, exit 1.
"""
import os
import sys

import mxnet as mx
from mxnet import gluon

from hvdtrain import create_store
from hvdtrain.loop.run.replica_check import ReplicaCheck
from hvdtrain.loop.run.together import StoppedTogether
from hvdtrain.store.agree import FaultInjected
from hvdtrain.store.dist import DistContext
from say import say


def main():
    dist = DistContext.from_store(create_store("horovod"))
    values = sys.argv[1:] == ["values"]
    net = gluon.nn.Dense(2 if values else 2 + dist.rank, in_units=3)
    mx.random.seed(dist.rank)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    try:
        ReplicaCheck(net, trainer, dist, "resync").verify("the test's check")
    except StoppedTogether as stop:
        say(stop.line)
        stop.leave()
        os._exit(stop.status)  # pylint: disable=protected-access
    except FaultInjected as err:
        say(f"replica_sizes_program.py: error: {err}")
        os._exit(1)  # pylint: disable=protected-access
    mx.nd.waitall()
    say("no difference found")


if __name__ == "__main__":
    main()
