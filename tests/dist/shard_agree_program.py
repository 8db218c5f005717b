"""One rank of a hand loop on ShardedTrainer (issue 63, findings 3 and 4).

Usage: shard_agree_program.py OUT_DIR CASE (under a launcher)

- ``save``: three steps, then ``save_states`` on every rank, each given its own path
  (OUT_DIR/states-rank<R>): rank 0 alone writes (OUT_DIR/rank<R>.json says which files
  exist after the call, the state's parameter count, and the SHA-256 of the state's
  bytes as this rank holds them, gathered: what an elastic commit keeps).
- ``stale``: at the second step rank 1 leaves one parameter without a gradient; every rank
  prints its error in one line, ``shard_agree_program.py: error: ...``, and exits 1.
"""
import hashlib
import json
import os
import pickle
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from hvdtrain import create_store
from hvdtrain.store.sharded import ShardedTrainer
from say import say


def main():
    out, case = sys.argv[1], sys.argv[2]
    store = create_store("horovod")
    rank = store.rank
    mx.random.seed(3)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=5), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    trainer = ShardedTrainer(net.collect_params(), "adam", {"learning_rate": 0.01},
                             kvstore=store, update_on_kvstore=False, bucket_mb=1 / 1024)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(rank)
    try:
        for step in range(3):
            x = mx.nd.array(rng.rand(4, 5))
            y = mx.nd.array(rng.randint(0, 3, 4))
            with autograd.record():
                if case == "stale" and step == 1 and rank == 1:
                    hidden = net[0](x)  # the last layer's weight gets no gradient
                    loss = (hidden * hidden).sum()
                else:
                    loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(4)
        mx.nd.waitall()
        if case == "save":
            path = os.path.join(out, f"states-rank{rank}")
            trainer.save_states(path)
            files = sorted(f for f in os.listdir(out) if f.startswith("states-"))
            states = pickle.loads(open(path, "rb").read()) if os.path.exists(path) else None
            count = len(states[0] if isinstance(states, tuple) else states) \
                if states is not None else None
            with open(os.path.join(out, f"rank{rank}.json"), "w") as dump:
                json.dump({"files": files, "states": count, "sha256": hashlib.sha256(
                    trainer.whole_states_later()()).hexdigest()}, dump)
    except (RuntimeError, UserWarning) as err:
        say(f"shard_agree_program.py: error: {' '.join(str(err).split())}")
        getattr(err, "leave", lambda: None)()
        os._exit(1)  # pylint: disable=protected-access
    store.shutdown()


if __name__ == "__main__":
    main()
