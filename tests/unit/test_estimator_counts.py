"""What the Estimator's records count, in one process: the unusable training samples are
counted whether or not ``fit`` has a validation split (it counted 0 without one)."""
import json

import mxnet as mx
import numpy as np
from mxnet import gluon

from hvdtrain import BadSample
from hvdtrain.estimator import Estimator

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
