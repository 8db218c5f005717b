"""A parameter-server worker program using MXNet alone (not hvdtrain), for hvdtrain-launch.

Worker 1 fails at its 5th step as PS_PROGRAM_FAIL says: ``raise`` (an uncaught exception)
or ``exit`` (``sys.exit(3)``); unset, both workers finish (and say the value of PS_PROGRAM_NOTE
when it is set). The other worker meanwhile
waits in a pushpull for worker 1's push, as a real training step would. PS_PROGRAM_STEPS
sets the number of steps (40; 20 ms or more each).
"""
import os
import sys
import time

import mxnet as mx
from say import say

STEPS = 40


def main():
    store = mx.kv.create("dist_sync")
    store.init(0, mx.nd.zeros(4))
    fail = os.environ.get("PS_PROGRAM_FAIL")
    for step in range(int(os.environ.get("PS_PROGRAM_STEPS", STEPS))):
        if store.rank == 1 and step == 5:
            if fail == "raise":
                raise RuntimeError("injected failure in worker 1")
            if fail == "exit":
                say("worker 1 exits with status 3")
                sys.exit(3)
        out = mx.nd.zeros(4)
        store.pushpull(0, mx.nd.ones(4), out=out)
        out.wait_to_read()
        time.sleep(0.05)
    say(f"worker {store.rank} done: {out.asnumpy().tolist()}")
    if "PS_PROGRAM_NOTE" in os.environ:
        say(f"worker {store.rank} note: {os.environ['PS_PROGRAM_NOTE']}")


if __name__ == "__main__":
    main()
