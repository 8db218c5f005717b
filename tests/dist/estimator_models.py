"""One rank of an example model (examples/regression.py, sequence.py, two_inputs.py) trained
by hvdtrain's Estimator as MXNet Estimator code does, dumping what
test_estimator_models.py compares with a plain one-process Gluon loop.

Usage: python estimator_models.py MODEL OUT_DIR [OPTION=VALUE ...] (under a launcher)

MODEL is ``regression`` (shuffled), ``sequence`` or ``two_inputs`` (in order); the example's
data, net, loss, metrics and batch processor, TRAIN training and VAL validation samples,
BATCH samples per rank and step, EPOCHS epochs, SGD at LR with momentum 0.9. Options are
RunConfig fields passed to the Estimator (``accumulate=2``, ``ema=0.9``,
``clip_grad_norm=1.0``, ``compression=powersgd``; numbers parsed), and the program's own:
``epochs=N``; ``unusable_first_step=1`` (the samples of the last rank's whole first step
of epoch 1 raise BadSample: that rank runs no pass in it); ``sigterm_at_step=S`` (the last
rank sends itself SIGTERM from a batch handler after step S, as Slurm would);
``stop_after_epoch=E`` (an epoch handler of the last rank alone asks to end training after
epoch E, as an early-stopping rule that saw other figures would); ``nudge_at_step=S`` (the
last rank alone adds 1e-3 to its layer 0.weight after step S: one replica differs);
``dropout=P`` (the regression net with Dropout(P) after its first layer). Writes
OUT_DIR/rank<R>-start.npz (rank 0: every array before the first step),
OUT_DIR/rank<R>.npz (every array after, and the moving average's as ``ema:<name>``) and
OUT_DIR/rank<R>.json (each metric's value as this rank reports it, the validation count,
the fit's result).
"""
import json
import os
import signal
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import regression  # noqa: E402
import sequence  # noqa: E402
import two_inputs  # noqa: E402
from hvdtrain.estimator import BatchEnd, Estimator, EpochEnd  # noqa: E402
from program_parts import Unusable, options as options_of  # noqa: E402

TRAIN, VAL, BATCH, EPOCHS, LR, SEED = 96, 40, 8, 2, 0.05, 3


def with_dropout(net, rate):
    """`net` with Dropout(`rate`) after its first layer (none when `rate` is 0)."""
    if not rate:
        return net
    layers = list(net._children.values())  # pylint: disable=protected-access
    dropped = gluon.nn.HybridSequential()
    dropped.add(layers[0], gluon.nn.Dropout(rate), *layers[1:])
    return dropped


def parts(model, dropout=0.0):
    """(net, loss, train metrics, batch processor or None, train data, val data, shuffle,
    batchify_fn) of `model`, the regression net with Dropout(`dropout`) if asked."""
    if model == "regression":
        return (with_dropout(regression.make_net(), dropout), gluon.loss.L2Loss(),
                [mx.metric.RMSE()], None,
                gluon.data.ArrayDataset(*regression.make_data(TRAIN, 1)),
                gluon.data.ArrayDataset(*regression.make_data(VAL, 2)), True, None)
    if model == "sequence":
        return (sequence.make_net(), sequence.SmoothedCrossEntropy(), [mx.metric.Accuracy()],
                None, gluon.data.ArrayDataset(*sequence.make_data(TRAIN, 1)),
                gluon.data.ArrayDataset(*sequence.make_data(VAL, 2)), False, None)
    return (two_inputs.make_net(), gluon.loss.L2Loss(),
            [mx.metric.MAE(), two_inputs.WithinHalf()], two_inputs.DictBatches(),
            two_inputs.make_data(TRAIN, 1), two_inputs.make_data(VAL, 2), False,
            two_inputs.stack)


def first_batch(model, data, batchify):
    """One batch's inputs, to settle the net's shapes before its arrays are dumped."""
    loader = gluon.data.DataLoader(data, batch_size=2, batchify_fn=batchify)
    batch = next(iter(loader))
    return (batch["user"], batch["item"]) if model == "two_inputs" else (batch[0],)


def first_step_of_last_rank(size, ranks, shuffle, seed, accumulate):
    """The samples of the last rank's first optimizer step in epoch 1 (docs/estimator.md:
    the order shuffled from (seed, epoch), strided over the ranks)."""
    order = np.random.default_rng([seed, 0]).permutation(size) if shuffle \
        else np.arange(size)
    return order[ranks - 1::ranks][:BATCH * accumulate]


class SigtermAt(BatchEnd):
    """The last rank sends itself SIGTERM after optimizer step `step` (a batch handler of
    the program's own; the engine has counted the step by then)."""

    def __init__(self, step):
        self.step = step

    def batch_end(self, estimator, *args, **kwargs):
        if estimator.rank == estimator.num_workers - 1 and estimator.state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class NudgeAt(BatchEnd):
    """The last rank alone adds `amount` to its ``0.weight`` after optimizer step `step`:
    a fault that makes one replica differ (a stand-in for a race, or a user's code that
    changes one rank's model)."""

    def __init__(self, step, amount=1e-3):
        self.step, self.amount = step, amount

    def batch_end(self, estimator, *args, **kwargs):
        if estimator.rank == estimator.num_workers - 1 and estimator.state.step == self.step:
            params = estimator.net._collect_params_with_prefix()  # pylint: disable=protected-access
            weight = params["0.weight"]
            weight.set_data(weight.data() + self.amount)


class StopAfterEpoch(EpochEnd):
    """The last rank alone asks to end training after epoch `epoch` (counted from 1)."""

    def __init__(self, epoch):
        self.epoch, self.seen = epoch, 0

    def epoch_end(self, estimator, *args, **kwargs):
        self.seen += 1
        return estimator.rank == estimator.num_workers - 1 and self.seen >= self.epoch


def main():
    model, out = sys.argv[1], sys.argv[2]
    options = options_of(sys.argv[3:])
    epochs = options.pop("epochs", EPOCHS)
    unusable = options.pop("unusable_first_step", 0)
    sigterm_at = options.pop("sigterm_at_step", None)
    stop_after = options.pop("stop_after_epoch", None)
    nudge_at = options.pop("nudge_at_step", None)
    dropout = options.pop("dropout", 0.0)
    mx.random.seed(SEED)
    net, loss, metrics, processor, train, val, shuffle, batchify = parts(model, dropout)
    net.initialize(mx.init.Xavier())
    net(*first_batch(model, train, batchify))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR,
                                                          "momentum": 0.9})
    estimator = Estimator(net, loss, train_metrics=metrics, trainer=trainer,
                          batch_processor=processor, **options)
    if unusable:
        train = Unusable(train, first_step_of_last_rank(
            len(train), estimator.num_workers, shuffle, estimator.config.seed,
            estimator.config.accumulate))
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    if estimator.rank == 0:  # the run starts from rank 0's arrays (broadcast in fit)
        np.savez(os.path.join(out, "rank0-start.npz"), **arrays)
    estimator.fit(gluon.data.DataLoader(train, batch_size=BATCH, shuffle=shuffle,
                                        batchify_fn=batchify),
                  val_data=gluon.data.DataLoader(val, batch_size=BATCH, batchify_fn=batchify),
                  epochs=epochs, event_handlers=([] if sigterm_at is None else
                                                 [SigtermAt(sigterm_at)])
                  + ([] if stop_after is None else [StopAfterEpoch(stop_after)])
                  + ([] if nudge_at is None else [NudgeAt(nudge_at)]))
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    if estimator.ema is not None:
        arrays.update({f"ema:{name}": array for name, array in estimator.ema.state().items()})
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays)
    reported = {m.name: float(m.get()[1]) for m in estimator.train_metrics + estimator.val_metrics}
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump({"metrics": reported, "val_count": estimator.val_count,
                   "result": estimator.result, "num_workers": estimator.num_workers}, dump)


if __name__ == "__main__":
    main()
