"""What the Estimator counts and names, in one process: the unusable training samples are
counted whether or not ``fit`` has a validation split (it counted 0 without one), and a
batch processor whose losses are a mean is refused naming the method ``fit`` ran (it named
``evaluate_batch``, the pass that settles the net's shapes)."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain import BadSample, ConfigError
from hvdtrain.estimator import BatchProcessor, Estimator

BAD = (3, 17, 30)  # of 40 training samples


class Unreadable(gluon.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if index in BAD:
            raise BadSample(f"sample {index} (made unusable by the test)")
        return self.x[index], self.y[index]


def test_unusable_training_samples_are_counted_without_a_validation_split(tmp_path):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 5)).astype(np.float32), rng.normal(size=(40, 1)).astype(
        np.float32)
    net = gluon.nn.Dense(1)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    estimator = Estimator(net, gluon.loss.L2Loss(), trainer=trainer, context=mx.cpu(),
                          kvstore="none", log_interval=0, output_dir=str(tmp_path / "run"),
                          max_bad_samples="10%")
    estimator.fit(gluon.data.DataLoader(Unreadable(x, y), batch_size=8), epochs=2)
    with open(tmp_path / "run" / "metrics.jsonl") as src:
        epochs = [r for r in map(json.loads, src) if r["event"] == "epoch"]
    assert [e["skipped_train_samples"] for e in epochs] == [len(BAD)] * 2, epochs
    assert [e["train_samples"] for e in epochs] == [40 - len(BAD)] * 2, epochs


class MeanLoss(BatchProcessor):
    """Returns the batch's mean loss (a mistake) from both methods."""

    def fit_batch(self, estimator, batch, batch_axis=0):
        x, y = batch
        with autograd.record():
            pred = estimator.net(x)
            loss = estimator.loss(pred, y).mean()
        estimator.backward(loss)
        return [x], [y], [pred], [loss]

    def evaluate_batch(self, estimator, batch, batch_axis=0):
        x, y = batch
        pred = estimator.val_net(x)
        return [x], [y], [pred], [estimator.val_loss(pred, y).mean()]


def test_a_mean_loss_met_in_fit_is_refused_naming_fit_batch():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(16, 3)).astype(np.float32), rng.normal(size=(16, 1)).astype(
        np.float32)
    net = gluon.nn.Dense(1)  # shapes deferred: fit settles them with a first pass
    net.initialize()
    estimator = Estimator(net, gluon.loss.L2Loss(), trainer=gluon.Trainer(
        net.collect_params(), "sgd"), batch_processor=MeanLoss(), context=mx.cpu(),
        kvstore="none", log_interval=0)
    with pytest.raises(ConfigError, match=r"^MeanLoss\.fit_batch returned losses of shape"):
        estimator.fit(gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=8),
                      epochs=1)
