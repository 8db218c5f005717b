"""A user's own 2-rank program on the README's library API, whose rank 0 pauses between two
collectives (as when it writes a checkpoint to slow storage or evaluates alone).

Usage: python paused_program.py PAUSE_SECONDS
Prints ``rank R sums A B`` after both ``pushpull`` calls.
"""
import sys
import time

import mxnet as mx

import hvdtrain  # noqa: F401  registers the 'horovod' KVStore
from say import say

store = mx.kv.create("horovod")
first = mx.nd.ones((4,)) * (store.rank + 1)
store.pushpull("first", first)
first.wait_to_read()
if store.rank == 0:
    say(f"rank 0 pauses {sys.argv[1]} s")
    time.sleep(float(sys.argv[1]))
second = mx.nd.ones((4,)) * (store.rank + 1)
store.pushpull("second", second)
say(f"rank {store.rank} sums {first.asnumpy()[0]:g} {second.asnumpy()[0]:g}")
