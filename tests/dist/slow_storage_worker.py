"""rank_worker.py on slow storage: rank 0's first checkpoint write takes SLOW_SECONDS longer.

Usage: python slow_storage_worker.py SLOW_SECONDS OUT_DIR [hvdtrain flags...]
A test shim only (not a product option): it wraps ``save_checkpoint`` as storage that
needs minutes to take a checkpoint would, then runs rank_worker.py's main.
"""
import sys
import time

import hvdtrain.state.checkpoint as checkpoint

import rank_worker
from say import say

SLOW_SECONDS = float(sys.argv.pop(1))
_save = checkpoint.save_checkpoint
_slowed = []


def slow_save(*args, **kwargs):
    if not _slowed:
        _slowed.append(True)
        say(f"slow storage: this checkpoint takes {SLOW_SECONDS:g} s more")
        time.sleep(SLOW_SECONDS)
    return _save(*args, **kwargs)


checkpoint.save_checkpoint = slow_save
rank_worker.main()
