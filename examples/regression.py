"""Your own model on hvdtrain: a regression MLP, written as MXNet Estimator code.

    horovodrun -np 2 -H localhost:2 python examples/regression.py
    horovodrun -np 2 -H localhost:2 python examples/regression.py --output-dir runs/regression

The only hvdtrain line is the Estimator's import (MXNet's is
``from mxnet.gluon.contrib.estimator import Estimator``). Each rank trains on its share of
every epoch, the gradients are averaged over the global batch, and the RMSE each rank
reports is the whole validation split's, per element. With ``--output-dir`` the run keeps
checkpoints and resumes exactly where it stopped (``--resume auto``), a SIGTERM mid-epoch
included.
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import gluon

from hvdtrain.estimator import Estimator

FEATURES = 6


def make_data(count, seed):
    """Points of a smooth function of six features, with noise: (x float32 (N, 6), y (N, 1))."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, FEATURES)).astype(np.float32)
    y = np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3] - 0.3 * x[:, 3:4]
    return x, (y + rng.normal(0, 0.05, size=y.shape)).astype(np.float32)


def make_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(32, activation="relu"),
            gluon.nn.Dense(1))
    return net


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--max-steps", type=int, help="stop after this many steps")
    parser.add_argument("--output-dir", help="checkpoints, metrics.jsonl, model.params")
    parser.add_argument("--resume", help="auto: continue from the newest checkpoint")
    args = parser.parse_args(argv)

    train = gluon.data.ArrayDataset(*make_data(960, seed=1))
    val = gluon.data.ArrayDataset(*make_data(200, seed=2))
    net = make_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.02, "momentum": 0.9})
    estimator = Estimator(net, gluon.loss.L2Loss(), train_metrics=mx.metric.RMSE(),
                          trainer=trainer, max_steps=args.max_steps,
                          output_dir=args.output_dir, resume=args.resume)
    estimator.fit(gluon.data.DataLoader(train, batch_size=16, shuffle=True),
                  val_data=gluon.data.DataLoader(val, batch_size=16), epochs=args.epochs)
    if estimator.rank == 0:
        rmse = estimator.val_metrics[0].get()[1]
        print(f"validation rmse {rmse:.4f} (target spread {make_data(200, 2)[1].std():.4f}) "
              f"over {estimator.val_count} samples")


if __name__ == "__main__":
    main()
