"""One rank of PowerSGD fed known gradients, dumping what the reference test compares.

Usage: python powersgd_ranks.py OUT_DIR START_STEP ERROR_FEEDBACK(0|1) [fp16] [clip=MAX]
(under horovodrun -np W).

A BucketedTrainer with PowerSGD (rank RANK) over the parameters of PARAMS (zeros at the
start), plain SGD at rate 1 without momentum or decay: each step the gradients are
overwritten with :func:`gradient` (this rank's, this step's) after a backward pass that
only marks them fresh, and ``trainer.step(COUNTS[t])``. After each step the rank writes
OUT_DIR/rank<R>-step<t>.npz: every gradient as exchanged times ``rescale_grad`` (the update
the optimizer applied), every parameter, and P, Q and this rank's error of each compressed
parameter. With ``clip=MAX`` each step goes through ``--clip-grad-norm MAX``'s clipper
instead of ``trainer.step``, and the update dumped is the one applied: the exchanged
gradient times the clipper's factor.
"""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import hvdtrain  # noqa: F401  registers 'horovod'
from hvdtrain.loop.recipe.clipping import GradClipper
from hvdtrain.store.buckets import BucketedTrainer
from hvdtrain.store.dist import DistContext
from hvdtrain.store.gluon_internals import set_up_store
from hvdtrain.store.kvstore import create_store
from hvdtrain.store.powersgd import PowerSGD

RANK = 2
SEED = 5
# name -> shape, in the Trainer's order. Which are compressed at rank 2 (DDP's rule,
# (n + m) r * 2 < n m) is written out in the test, not derived from hvdtrain.
PARAMS = {"dense0_weight": (24, 40), "dense0_bias": (24,), "conv_weight": (8, 4, 3, 3),
          "conv_bias": (8,), "dense1_weight": (10, 24), "thin_weight": (3, 2),
          "gamma": (10,)}
# The global sample count of each step (the divisor): the third is a short last batch.
COUNTS = [24, 24, 7, 24, 24]


def gradient(rank, step, index, shape):
    """Rank `rank`'s summed gradient of parameter `index` at `step`: a fixed low-rank
    trend shared by all ranks plus noise of this rank's own."""
    trend = np.random.RandomState(index)
    rows, cols = shape[0], int(np.prod(shape[1:]))
    low = trend.standard_normal((rows, 2)) @ trend.standard_normal((2, cols))
    noise = np.random.RandomState(1000 * rank + 37 * step + index).standard_normal((rows, cols))
    return ((1 + 0.1 * step) * low + noise).reshape(shape).astype(np.float32)


def main():
    out_dir, start = sys.argv[1], int(sys.argv[2])
    error_feedback, fp16 = sys.argv[3] == "1", "fp16" in sys.argv[4:]
    clip = [float(a[len("clip="):]) for a in sys.argv[4:] if a.startswith("clip=")]
    store = create_store("horovod", compression="fp16" if fp16 else "none", fuse_calls=False)
    params = []
    for name, shape in PARAMS.items():
        param = gluon.Parameter(name, shape=shape, init=mx.init.Zero())
        param.initialize(ctx=mx.cpu())
        params.append(param)
    compression = PowerSGD(RANK, start_step=start, error_feedback=error_feedback, seed=SEED)
    trainer = BucketedTrainer(params, "sgd", {"learning_rate": 1.0, "wd": 0.0},
                              kvstore=store, update_on_kvstore=False, bucket_mb=0.002,
                              compression=compression)
    set_up_store(trainer, COUNTS[0])
    clipper = None
    if clip:
        model = gluon.ParameterDict()
        for param in params:
            model._params[param.name] = param  # pylint: disable=protected-access
        clipper = GradClipper(clip[0], _Net(model), DistContext.from_store(store))
    for step, count in enumerate(COUNTS):
        with autograd.record():  # marks every gradient as written by backward
            total = sum((p.data() * 0).sum() for p in params)
        total.backward()
        for index, param in enumerate(params):
            param.grad()[:] = gradient(store.rank, step, index, param.shape)
        factor = 1.0
        if clipper is None:
            trainer.step(count)
        else:
            factor = clipper.step(trainer, count)
        scale = factor / count
        dump = {f"update.{p.name}": p.grad().asnumpy() * scale for p in params}
        dump.update({f"param.{p.name}": p.data().asnumpy() for p in params})
        for index, param in enumerate(params):
            if compression.compresses(param.shape):
                p, q, error = compression.factors(index)
                dump.update({f"p.{param.name}": p, f"q.{param.name}": q,
                             f"error.{param.name}": error})
        np.savez(os.path.join(out_dir, f"rank{store.rank}-step{step}.npz"), **dump)
    with open(os.path.join(out_dir, f"rank{store.rank}.buckets"), "w") as out:
        out.write(str(len(trainer.buckets)))


class _Net:  # what GradClipper asks of a model
    def __init__(self, params):
        self._params = params

    def collect_params(self):
        return self._params


if __name__ == "__main__":
    main()
