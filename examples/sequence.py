"""Your own model on hvdtrain: a sequence classifier (an embedding and an LSTM) with a loss
of its own, written as MXNet Estimator code.

    horovodrun -np 2 -H localhost:2 python examples/sequence.py

Each sequence is 12 tokens of a vocabulary of 20; its class says whether token 3 comes
before token 7 in it. The loss is the program's own Gluon loss (label-smoothed
cross-entropy written out), the metric MXNet's Accuracy.
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import gluon

from hvdtrain.estimator import Estimator

VOCABULARY, LENGTH = 20, 12


def make_data(count, seed):
    """(tokens float32 (N, 12), labels float32 (N,)): 1 when token 3 comes before token 7."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCABULARY, size=(count, LENGTH))
    first = lambda t: np.where((tokens == t).any(1), (tokens == t).argmax(1), LENGTH)  # noqa: E731
    labels = (first(3) < first(7)).astype(np.float32)
    return tokens.astype(np.float32), labels


class SequenceNet(gluon.nn.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embed = gluon.nn.Embedding(VOCABULARY, 16)
        self.lstm = gluon.rnn.LSTM(24, layout="NTC")
        self.out = gluon.nn.Dense(2)

    def hybrid_forward(self, F, tokens):  # pylint: disable=arguments-differ
        states = self.lstm(self.embed(tokens))
        return self.out(F.slice_axis(states, axis=1, begin=-1, end=None))


class SmoothedCrossEntropy(gluon.loss.Loss):
    """Cross-entropy against targets smoothed by `smoothing`, per sample: the program's own."""

    def __init__(self, smoothing=0.1, **kwargs):
        super().__init__(weight=None, batch_axis=0, **kwargs)
        self.smoothing = smoothing

    def hybrid_forward(self, F, pred, label):  # pylint: disable=arguments-differ
        log_p = F.log_softmax(pred, axis=-1)
        target = F.one_hot(label, 2) * (1 - self.smoothing) + self.smoothing / 2
        return -F.sum(target * log_p, axis=-1)


def make_net():
    return SequenceNet()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--max-steps", type=int, help="stop after this many steps")
    args = parser.parse_args(argv)

    train = gluon.data.ArrayDataset(*make_data(960, seed=1))
    val = gluon.data.ArrayDataset(*make_data(200, seed=2))
    net = make_net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    estimator = Estimator(net, SmoothedCrossEntropy(), train_metrics=mx.metric.Accuracy(),
                          trainer=trainer, max_steps=args.max_steps)
    estimator.fit(gluon.data.DataLoader(train, batch_size=16, shuffle=True),
                  val_data=gluon.data.DataLoader(val, batch_size=16), epochs=args.epochs)
    if estimator.rank == 0:
        print(f"validation accuracy {estimator.val_metrics[0].get()[1]:.4f} over "
              f"{estimator.val_count} samples")


if __name__ == "__main__":
    main()
