"""MXNet's event handlers on several ranks, deciding alike: the program of
test_estimator_handlers.py.

    mpirun -np 2 python handler_program.py SCENARIO OUT_DIR

``checkpoints``: three checkpoint handlers save every 2 batches and keep the best model by a
training metric read inside the epoch (``MeanLabel``: the mean label, whose value each rank's
own share makes differ): hvdtrain's ``CheckpointHandler`` in a folder all ranks share,
MXNet's own (imported from mxnet) and a program's subclass of it, each in a folder of its
rank's own (OUT_DIR/<kind>/rank<R>, as on a node's local disk).
``empty``: the last rank's second batch of every epoch, and its first validation batch, are
samples that raise BadSample; MXNet's LoggingHandler(log_interval=1),
ValidationHandler(batch_period=3) and CheckpointHandler(batch_period=2) count batches, and a
handler of the program's own ends the second epoch when it sees an empty batch (the last
rank alone sees one).
``resume``: each rank's model_dir is its own (OUT_DIR/node<R>); rank 0's holds a newer
checkpoint than the other's, and MXNet's CheckpointHandler resumes from it.
``unreadable``: as ``resume``, but rank 0's checkpoint has no .states file, and the other
rank's folder no checkpoint.

Writes OUT_DIR/rank0-start.npz (rank 0's arrays before fit), OUT_DIR/rank<R>.npz (every
array after) and OUT_DIR/rank<R>.json (what the scenario's handlers saw).
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon.contrib import estimator as mx_estimator

from program_parts import Unusable
from say import say
from hvdtrain.estimator import (BatchBegin, BatchEnd, CheckpointHandler, EpochBegin, EpochEnd,
                                Estimator, TrainBegin)

SEED, LR, TRAIN, VAL, BATCH = 7, 0.05, 24, 8, 2  # BATCH: a rank's; 6 steps an epoch at 2
# The mean label the "checkpoints" scenario monitors: rank r's batch j holds positions
# 4j + r and 4j + r + 2 (strided over 2 ranks), both labelled LABELS[r][j]. Rank 0's running
# mean rises at every check, the last rank's falls after its first: alone, they would
# disagree on "best"; over both, it improves at the first and the third check only.
LABELS = [[0, 1, 2, 3, 20, 30], [5, 5, 0, 0, 0, 0]]
BAD_TRAIN, BAD_VAL = {5, 7}, {1, 3}  # the last rank's 2nd batch; its 1st validation batch
# The "resume" scenario's checkpoints: rank 0's newer than the last rank's.
NEWER, OLDER = "model-epoch1batch11", "model-epoch0batch5"


class MeanLabel(mx.metric.EvalMetric):
    """The mean of the labels seen (the predictions ignored): a value that depends on which
    samples a rank saw, not on training. Keeps sum_metric and num_inst per sample."""

    def __init__(self, name="mean label"):
        super().__init__(name)

    def update(self, labels, preds):
        for label in labels if isinstance(labels, (list, tuple)) else [labels]:
            total, count = float(label.sum().asscalar()), int(label.size)
            self.sum_metric += total
            self.global_sum_metric += total
            self.num_inst += count
            self.global_num_inst += count


class Keeping(mx_estimator.CheckpointHandler):
    """A program's subclass of MXNet's CheckpointHandler: notes each save, then MXNet's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def _save_params_and_trainer(self, estimator, file_prefix):
        self.calls.append(file_prefix)
        super()._save_params_and_trainer(estimator, file_prefix)


class Recorder(TrainBegin, EpochBegin, BatchBegin, BatchEnd, EpochEnd):
    """What the handlers before it left, after each event (priority 1: after MXNet's and
    the checkpoint handlers, before the log)."""

    def __init__(self, checkpoints=(), monitor=None):
        self.priority = 1
        self.checkpoints, self.monitor = list(checkpoints), monitor
        self.epochs, self.best, self.own, self.empty = [], [], [], []
        self.started = None

    def train_begin(self, estimator, *args, **kwargs):
        self.started = {"arrays": arrays_of(estimator.net),
                        "momentum": {str(i): s.asnumpy().tolist() for i, s in
                                     estimator.trainer._updaters[0].states.items()},
                        "max_epoch": estimator.max_epoch}

    def epoch_begin(self, estimator, *args, **kwargs):
        self.epochs.append({"begin": 0, "end": 0})

    def batch_begin(self, estimator, *args, **kwargs):
        self.epochs[-1]["begin"] += 1

    def batch_end(self, estimator, *args, **kwargs):
        self.epochs[-1]["end"] += 1
        batch = kwargs["batch"]
        if batch[0].shape[0] == 0:
            self.empty.append({"shapes": [list(a.shape) for a in batch],
                               "lists": [kwargs[k] == [] for k in ("pred", "label", "loss")],
                               "epoch": len(self.epochs), "position": self.epochs[-1]["end"]})
        if self.checkpoints:
            self.best.append([float(h.best) for h in self.checkpoints])
            self.own.append(float(self.monitor.get()[1]))


class Counter(BatchEnd):
    """Counts the batch positions of the evaluations it is given to, and the empty ones."""

    def __init__(self):
        self.batches, self.empty = 0, 0

    def batch_end(self, estimator, *args, **kwargs):
        self.batches += 1
        self.empty += kwargs["batch"][0].shape[0] == 0


class EndOnEmpty(BatchEnd):
    """Ends the second epoch at the first empty batch it sees (the last rank alone sees
    one): a handler's decision of one rank, which every rank must follow."""

    def batch_end(self, estimator, *args, **kwargs):
        return estimator.state.epoch == 1 and kwargs["batch"][0].shape[0] == 0


def make_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(3, in_units=4, activation="tanh"), gluon.nn.Dense(1, in_units=3))
    return net


def make_data(size, seed, labels=None):
    """A dataset of `size` samples of 4 features: a linear target, or `labels`' numbers."""
    return gluon.data.ArrayDataset(*xy(size, seed, labels))


def xy(size, seed, labels=None):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, 4)).astype(np.float32)
    if labels is None:
        y = x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.1
    else:  # position p: rank p % 2's batch p // 4 (see LABELS)
        y = np.array([labels[p % 2][p // 4] for p in range(size)], np.float32)
    return x, y.astype(np.float32)


def arrays_of(net):
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def checkpoints(estimator, out, train):
    rank, metric = estimator.rank, estimator.train_metrics[0]
    keep = dict(monitor=metric, save_best=True, mode="max", batch_period=2,
                max_checkpoints=2)
    handlers = [CheckpointHandler(os.path.join(out, "shared"), **keep),
                mx_estimator.CheckpointHandler(os.path.join(out, "mxnet", f"rank{rank}"),
                                               **keep),
                Keeping(os.path.join(out, "subclass", f"rank{rank}"), **keep)]
    saves, save = [], estimator.save_model_files
    estimator.save_model_files = lambda p, t: (saves.append(os.path.basename(p)), save(p, t))
    recorder = Recorder(handlers, metric)
    estimator.fit(gluon.data.DataLoader(train, batch_size=BATCH), epochs=2,
                  event_handlers=handlers + [recorder])
    return {"best": recorder.best, "own": recorder.own, "saves": saves,
            "subclass_calls": handlers[-1].calls,
            "classes": [type(h).__name__ for h in handlers],
            "final": float(metric.get()[1])}


def empty(estimator, out, train):
    val = Unusable(make_data(VAL, 2), BAD_VAL)
    val_loader = gluon.data.DataLoader(val, batch_size=BATCH)
    logging = mx_estimator.LoggingHandler(log_interval=1, metrics=estimator.train_metrics)
    counter, recorder = Counter(), Recorder()
    validation = mx_estimator.ValidationHandler(val_loader, estimator.evaluate, batch_period=3,
                                                event_handlers=[counter])
    saving = mx_estimator.CheckpointHandler(os.path.join(out, f"saves{estimator.rank}"),
                                            epoch_period=None, batch_period=2,
                                            max_checkpoints=1)
    estimator.fit(gluon.data.DataLoader(Unusable(train, BAD_TRAIN), batch_size=BATCH),
                  epochs=2, event_handlers=[logging, validation, saving, recorder,
                                            EndOnEmpty()])
    return {"epochs": recorder.epochs, "empty": recorder.empty,
            "checkpoint_batches": saving.current_batch,
            "logged_samples": logging.processed_samples, "val_batches": counter.batches,
            "val_empty": counter.empty, "val_count": estimator.val_count}


def write_checkpoint(folder, prefix, seed):
    """A checkpoint of this rank's own, made as a one-process Gluon program makes one: the
    net at seed `seed` after a step of SGD with momentum (so its states are not zeros)."""
    mx.random.seed(seed)
    net = make_net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR,
                                                          "momentum": 0.9}, kvstore=None)
    x, y = (mx.nd.array(a) for a in xy(8, seed))
    with mx.autograd.record():
        loss = gluon.loss.L2Loss()(net(x), y)
    loss.backward()
    trainer.step(8)
    net.save_parameters(os.path.join(folder, prefix + ".params"))
    trainer.save_states(os.path.join(folder, prefix + ".states"))


def resume(estimator, out, train):
    folder = os.path.join(out, f"node{estimator.rank}")
    os.makedirs(folder, exist_ok=True)
    write_checkpoint(folder, OLDER, 100 + estimator.rank)
    if estimator.rank == 0:
        write_checkpoint(folder, NEWER, 200)
    handler = mx_estimator.CheckpointHandler(folder, resume_from_checkpoint=True)
    recorder = Recorder()
    estimator.fit(gluon.data.DataLoader(train, batch_size=BATCH), epochs=4,
                  event_handlers=[handler, recorder])
    return {"trained": [handler.trained_epoch, handler.trained_batch],
            "started": {"momentum": recorder.started["momentum"],
                        "max_epoch": recorder.started["max_epoch"]},
            "epochs": len(recorder.epochs), "class": type(handler).__name__,
            "files": sorted(os.listdir(folder))}, recorder.started["arrays"]


def unreadable(estimator, out, train):
    """Rank 0's newest checkpoint lacks its .states file: every rank stops, in one line."""
    folder = os.path.join(out, f"node{estimator.rank}")
    os.makedirs(folder, exist_ok=True)
    if estimator.rank == 0:
        write_checkpoint(folder, NEWER, 200)
        os.remove(os.path.join(folder, NEWER + ".states"))
    estimator.fit(gluon.data.DataLoader(train, batch_size=BATCH), epochs=4,
                  event_handlers=[mx_estimator.CheckpointHandler(
                      folder, resume_from_checkpoint=True)])
    return {}


def main():
    try:
        run()
    except RuntimeError as err:  # a fault test's (test_agree_faults.py): one line, exit 1
        say(f"handler_program.py: error: {err}")
        getattr(err, "leave", lambda: None)()
        os._exit(1)  # pylint: disable=protected-access


def run():
    scenario, out = sys.argv[1], sys.argv[2]
    mx.random.seed(SEED)
    net = make_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR,
                                                          "momentum": 0.9})
    metrics = [MeanLabel()] if scenario == "checkpoints" else [mx.metric.RMSE()]
    estimator = Estimator(net, gluon.loss.L2Loss(), train_metrics=metrics, trainer=trainer,
                          max_bad_samples="50%")
    if estimator.rank == 0:  # the run starts from rank 0's arrays (broadcast in fit)
        np.savez(os.path.join(out, "rank0-start.npz"), **arrays_of(net))
    train = make_data(TRAIN, 1, LABELS if scenario == "checkpoints" else None)
    seen = {"checkpoints": checkpoints, "empty": empty, "resume": resume,
            "unreadable": unreadable}[scenario](
        estimator, out, train)
    if isinstance(seen, tuple):
        seen, started = seen
        np.savez(os.path.join(out, f"rank{estimator.rank}-started.npz"), **started)
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays_of(net))
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump(seen, dump)


if __name__ == "__main__":
    main()
