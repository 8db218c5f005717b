"""rank_worker.py with a record of which samples this rank read: every call of
``ImageLoader.sample`` appends ``[train, epoch, index, digest]`` (train 1 for the training
split; digest, a hash of the transformed image's bytes, None where it could not be read)
to OUT_DIR/ids-rank<R>.json, written when the run ends.

Usage: python image_worker.py OUT_DIR [hvdtrain flags...]
"""
import hashlib
import json
import os
import sys
import threading

import numpy as np

import rank_worker
from hvdtrain.data import streamed

SEEN = []
LOCK = threading.Lock()
plain_sample = streamed.ImageLoader.sample


def recorded_sample(self, index, epoch, out=None):
    digest = None  # a sample that cannot be read is recorded too
    try:
        image, label = plain_sample(self, index, epoch, out=out)
        digest = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()[:16]
        return image, label
    finally:
        with LOCK:
            SEEN.append([int(self.train), int(epoch), int(index), digest])


streamed.ImageLoader.sample = recorded_sample
real_train = rank_worker.train


def train_and_dump(cfg):
    run = real_train(cfg)
    with open(os.path.join(sys.argv[1], f"ids-rank{run.dist.rank}.json"), "w") as out:
        json.dump(SEEN, out)
    return run


rank_worker.train = train_and_dump

if __name__ == "__main__":
    rank_worker.main()
