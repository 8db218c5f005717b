"""The ``hvdtrain`` command with test hooks, for stops at moments a test cannot time from
outside. A test shim only (not a product option).

Usage: python preempt_worker.py [hvdtrain flags...], with

- HVDTRAIN_TEST_SIGNAL_AT=start-up|evaluation and HVDTRAIN_TEST_SIGNAL_RANK=R: rank R sends
  itself SIGTERM during start-up (just before the store is created) or during the run's first
  evaluation, and says so;
- HVDTRAIN_TEST_SLOW_WRITE=SECONDS: rank 0's background writes of checkpoints taken inside an
  epoch take that much longer, in the middle of the write (storage that needs minutes), each
  saying so when it starts.
"""
import os
import signal
import sys
import time

import hvdtrain.cli
import hvdtrain.job
import hvdtrain.estimator.estimator
from hvdtrain.state.background import HostCopy
from hvdtrain.report.log import launch_rank
from say import say

AT = os.environ.get("HVDTRAIN_TEST_SIGNAL_AT")
RANK = int(os.environ.get("HVDTRAIN_TEST_SIGNAL_RANK", "0"))
SLOW = float(os.environ.get("HVDTRAIN_TEST_SLOW_WRITE", "0"))


def signal_myself(where):
    say(f"rank {RANK}: SIGTERM to myself during {where}")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # still inside that phase when the signal is noted


def wrap_build_dist(build_dist):
    def wrapped(*args, **kwargs):
        if launch_rank() == RANK:
            signal_myself("start-up")
        return build_dist(*args, **kwargs)
    return wrapped


def wrap_evaluate(evaluate, done=[]):  # pylint: disable=dangerous-default-value
    def wrapped(context, processor, loader, dist, *args, **kwargs):
        if not done and dist.rank == RANK:
            done.append(True)
            signal_myself("evaluation")
        return evaluate(context, processor, loader, dist, *args, **kwargs)
    return wrapped


def wrap_write(write):
    def wrapped(self, path):  # in the temporary folder, as a long write is cut short
        if "-step-" in path:
            say(f"slow write: {os.path.basename(os.path.dirname(path))} takes {SLOW:g} s more")
            time.sleep(SLOW)
        return write(self, path)
    return wrapped


if AT == "start-up":
    hvdtrain.job.build_dist = wrap_build_dist(hvdtrain.job.build_dist)
elif AT == "evaluation":
    hvdtrain.estimator.estimator.evaluate = wrap_evaluate(hvdtrain.estimator.estimator.evaluate)
if SLOW:
    HostCopy.save_parameters = wrap_write(HostCopy.save_parameters)
sys.argv = ["hvdtrain"] + sys.argv[1:]
hvdtrain.cli.run()
