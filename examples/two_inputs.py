"""Your own model on hvdtrain: two inputs fed as dict batches, with per-sample weights and a
metric of the program's own, written as MXNet Estimator code.

    horovodrun -np 2 -H localhost:2 python examples/two_inputs.py

Each sample is a dict: a user's features ``"user"`` (4 numbers), an item's ``"item"`` (3),
the rating ``"rating"`` and its weight ``"weight"`` (how much the sample counts). A batch
processor of the program's own turns a batch into the model's two inputs and the weighted
loss: what MXNet's ``BatchProcessor`` subclasses do, plus ``batch_samples`` (how many
samples a batch holds: hvdtrain sums it over the ranks into the update's divisor).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from hvdtrain.estimator import BatchProcessor, Estimator


def make_data(count, seed):
    """A list of dict samples: the rating is a product of the two feature vectors' sums."""
    rng = np.random.default_rng(seed)
    user = rng.normal(size=(count, 4)).astype(np.float32)
    item = rng.normal(size=(count, 3)).astype(np.float32)
    rating = np.tanh(user.sum(1) * 0.5) * np.tanh(item.sum(1) * 0.5) * 2.0
    weight = rng.uniform(0.5, 1.5, size=count).astype(np.float32)
    return [dict(user=u, item=i, rating=np.float32(r), weight=w)
            for u, i, r, w in zip(user, item, rating, weight)]


def stack(samples):
    """The batch of dict samples: a dict of stacked arrays."""
    return {key: mx.nd.array(np.stack([s[key] for s in samples])) for key in samples[0]}


class TwoTowers(gluon.nn.HybridBlock):
    """A tower for each input, then a layer over both: the rating is a product of the two
    sides, which no sum of the towers' outputs could make."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.user = gluon.nn.Dense(16, activation="relu")
        self.item = gluon.nn.Dense(16, activation="relu")
        self.both = gluon.nn.Dense(32, activation="relu")
        self.out = gluon.nn.Dense(1)

    def hybrid_forward(self, F, user, item):  # pylint: disable=arguments-differ
        return self.out(self.both(F.concat(self.user(user), self.item(item), dim=1)))


class DictBatches(BatchProcessor):
    """Dict batches: two inputs, the rating as the label, the weight per sample."""

    def split(self, batch, devices):
        parts = {key: gluon.utils.split_and_load(value, devices[:min(len(devices), len(value))],
                                                 even_split=False)
                 for key, value in batch.items()}
        return [dict(zip(parts, values)) for values in zip(*parts.values())]

    def batch_samples(self, batch, batch_axis=0):
        return batch["rating"].shape[0]

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        parts = self.split(train_batch, estimator.context)
        with autograd.record():
            pred = [estimator.net(p["user"], p["item"]) for p in parts]
            loss = [estimator.loss(y, p["rating"], p["weight"].reshape((-1, 1)))
                    for y, p in zip(pred, parts)]
        estimator.backward(loss)
        return parts, [p["rating"] for p in parts], pred, loss

    def evaluate_batch(self, estimator, val_batch, batch_axis=0):
        parts = self.split(val_batch, estimator.context)
        pred = [estimator.val_net(p["user"], p["item"]) for p in parts]
        loss = [estimator.val_loss(y, p["rating"], p["weight"].reshape((-1, 1)))
                for y, p in zip(pred, parts)]
        return parts, [p["rating"] for p in parts], pred, loss


class WithinHalf(mx.metric.EvalMetric):
    """Share of samples predicted within 0.5 of their rating: the program's own metric. It
    adds to sum_metric and num_inst per sample, so the ranks' shares sum to the split's."""

    def __init__(self):
        super().__init__("within 0.5")

    def update(self, labels, preds):
        for label, pred in zip(labels, preds):
            close = np.abs(pred.asnumpy().reshape(-1) - label.asnumpy().reshape(-1)) < 0.5
            self.sum_metric += float(close.sum())
            self.global_sum_metric += float(close.sum())
            self.num_inst += close.size
            self.global_num_inst += close.size


def make_net():
    return TwoTowers()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--max-steps", type=int, help="stop after this many steps")
    args = parser.parse_args(argv)

    net = make_net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.05, "momentum": 0.9})
    estimator = Estimator(net, gluon.loss.L2Loss(),
                          train_metrics=[mx.metric.MAE(), WithinHalf()], trainer=trainer,
                          batch_processor=DictBatches(), max_steps=args.max_steps)
    estimator.fit(gluon.data.DataLoader(make_data(960, seed=1), batch_size=16, shuffle=True,
                                        batchify_fn=stack),
                  val_data=gluon.data.DataLoader(make_data(200, seed=2), batch_size=16,
                                                 batchify_fn=stack),
                  epochs=args.epochs)
    if estimator.rank == 0:
        mae, within = (m.get()[1] for m in estimator.val_metrics)
        print(f"validation mae {mae:.4f}, within 0.5 {within:.4f} over "
              f"{estimator.val_count} samples")


if __name__ == "__main__":
    main()
