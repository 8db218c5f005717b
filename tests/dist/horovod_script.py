"""A Horovod script in the style of GluonCV's train_horovod.py, with one import to choose.

Usage: python horovod_script.py OUT_DIR MODULE [OPTION=VALUE ...] (under a launcher)

MODULE is ``horovod.mxnet`` or ``hvdtrain.horovod``: the script imports it as ``hvd`` and
changes nothing else. A hand loop: ``hvd.init()``, a hybridized conv net with BatchNorm
initialised deferred and sent by ``hvd.broadcast_parameters``, ``hvd.DistributedTrainer``,
each rank its contiguous half of every global batch (the last global batch uneven, split
unevenly), ``trainer.step(batch_size)``, a validation pass after each epoch and a per-rank
export of every array after it (OUT_DIR/rank<R>-epoch<E>.npz). Options: ``epochs`` (2),
``hang`` / ``die`` / ``nudge`` (``rank:step``: that rank stops for ever / exits / moves a
weight of its own after that step),
``metric=1`` (validation accuracy reduced with ``hvd.allreduce_metric``), ``trainers=2``
(the first two blocks' parameters in a DistributedTrainer of their own), ``same_seed=1``
(every rank initialised alike, no broadcast), ``symbol=1`` (a SymbolBlock with a BatchNorm
first).

Writes OUT_DIR/rank<R>.json: the validation accuracy each epoch, the steps taken.
"""
import importlib
import json
import os
import signal
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

BATCH, SAMPLES, VAL, SEED = 8, 3 * 16 + 5, 24, 3  # the last global batch: 5 samples


def symbol_block():
    """A convolution and a BatchNorm brought in as a symbol (as GluonCV's SSD brings its
    feature expander): the BatchNorm's statistics are the graph's auxiliary states."""
    data = mx.sym.var("data")
    out = mx.sym.BatchNorm(mx.sym.Convolution(data, num_filter=3, kernel=(3, 3), pad=(1, 1),
                                              no_bias=True, name="sym_conv"), name="sym_bn")
    return gluon.SymbolBlock(out, data)


def build_net(symbol=False):
    net = gluon.nn.HybridSequential()
    if symbol:
        net.add(symbol_block())
    net.add(gluon.nn.Conv2D(6, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.MaxPool2D(2), gluon.nn.Conv2D(8, 3), gluon.nn.BatchNorm(),
            gluon.nn.Activation("relu"), gluon.nn.Dense(5))
    return net


def data(count, seed):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 5, count)
    images = rng.normal(0, 1, (count, 3, 8, 8)).astype(np.float32)
    images[np.arange(count), labels % 3] += labels[:, None, None] * 0.5
    return images, labels.astype(np.float32)


def global_batches(count, batch):
    """Index ranges of each global batch (`batch` a rank, two ranks), the last uneven."""
    return [(s, min(s + 2 * batch, count)) for s in range(0, count, 2 * batch)]


def my_half(start, stop, rank, ranks):
    """A rank's contiguous part of a global batch: the first rank takes the larger half."""
    cut = start + -(-(stop - start) // ranks)
    return (start, cut) if rank == 0 else (cut, stop)


def main(out_dir, module, options):
    hvd = importlib.import_module(module)
    hvd.init()
    rank, ranks = hvd.rank(), hvd.size()
    same_seed = options.get("same_seed") == "1"
    # Each rank's own initial weights, which the broadcast must fix; or (same_seed=1) the
    # same everywhere and no broadcast: Horovod's own can crash a rank (store/broadcast.py).
    mx.random.seed(SEED + (0 if same_seed else rank))
    symbol = options.get("symbol") == "1"
    net = build_net(symbol)
    if symbol:  # a SymbolBlock's BatchNorm has no initializers of its own: Xavier takes no vector
        net.collect_params("sym_bn_gamma|sym_bn_moving_var").initialize(mx.init.One())
        net.collect_params("sym_bn_beta|sym_bn_moving_mean").initialize(mx.init.Zero())
        net.collect_params("^(?!sym_bn).*").initialize(mx.init.Xavier())
    else:
        net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    if not same_seed:
        hvd.broadcast_parameters(params, root_rank=0)  # deferred: sent at the first forward
    if options.get("trainers") == "2":  # the first two blocks' parameters apart
        head = [p for block in (net[0], net[1]) for p in block.collect_params().values()]
        groups = [head, [p for p in params.values() if all(p is not q for q in head)]]
    else:
        groups = [params]
    trainers = [hvd.DistributedTrainer(group, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
                for group in groups]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    images, labels = data(SAMPLES, 1)
    val_images, val_labels = data(VAL, 2)
    hang = options.get("hang", "").split(":")
    die = options.get("die", "").split(":")
    nudge = options.get("nudge", "").split(":")
    alone = options.get("alone", "").split(":")
    record, step = {"rank": rank, "val_acc": []}, 0
    for epoch in range(int(options.get("epochs", 2))):
        for start, stop in global_batches(SAMPLES, BATCH):
            lo, hi = my_half(start, stop, rank, ranks)
            step += 1
            if hang[0] == str(rank) and hang[1] == str(step):
                os.kill(os.getpid(), signal.SIGSTOP)
            if die[0] == str(rank) and die[1] == str(step):
                os._exit(3)
            x, y = mx.nd.array(images[lo:hi]), mx.nd.array(labels[lo:hi])
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            if options.get("clip") == "1":  # Horovod's clipping idiom
                for trainer in trainers:
                    trainer.allreduce_grads()
                gluon.utils.clip_global_norm([p.grad() for p in params.values()
                                              if p.grad_req != "null"], 10.0)
                for trainer in trainers:
                    trainer.update(hi - lo)
            else:
                for trainer in trainers:
                    trainer.step(hi - lo)
            if alone[0] == str(rank) and alone[1] == str(step):  # a collective one rank makes
                hvd.allreduce_metric(mx.metric.Accuracy())
            if nudge[0] == str(rank) and nudge[1] == str(step):  # one rank's weight moved
                first = next(iter(params.values()))
                first.set_data(first.data() + 1e-3)
        metric = mx.metric.Accuracy()
        half = VAL // ranks
        for at in range(rank * half, (rank + 1) * half, BATCH):
            end = min(at + BATCH, (rank + 1) * half)
            metric.update([mx.nd.array(val_labels[at:end])], [net(mx.nd.array(val_images[at:end]))])
        if options.get("metric") == "1":
            record["val_acc"].append(hvd.allreduce_metric(metric)[1])
        else:
            record["val_acc"].append(metric.get()[1])
        arrays = {name: p.data().asnumpy()
                  for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
        np.savez(os.path.join(out_dir, f"rank{rank}-epoch{epoch}.npz"), **arrays)
    record["steps"] = step
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as out:
        json.dump(record, out)
    if options.get("linger"):
        time.sleep(float(options["linger"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:]))
