"""A user's own model trained elastically by hvdtrain's Estimator: examples/regression.py's
MLP and data with ``elastic=True``, for tests/dist/elastic_job.py ``--program estimator``.

It takes the flags elastic_job.py gives the ``hvdtrain`` command and uses those a program
of its own would pass to the Estimator (``--epochs``, ``--batch-size``, ``--elastic``,
``--commit-every``, ``--log-interval``, ``--output-dir``, ``--resume``); the command's data
and model flags do not apply to it and are left alone. Rank 0 prints the validation RMSE
and the targets' spread at the end.
"""
import argparse
import os
import sys

import mxnet as mx
from mxnet import gluon

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import regression  # noqa: E402
from hvdtrain.estimator import Estimator  # noqa: E402
from say import say  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--elastic", action="store_true")
    parser.add_argument("--commit-every", type=int)
    parser.add_argument("--log-interval", type=int, default=0)
    parser.add_argument("--output-dir")
    parser.add_argument("--resume")
    args, _ = parser.parse_known_args()
    mx.random.seed(1)
    net = regression.make_net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.02,
                                                          "momentum": 0.9})
    estimator = Estimator(net, gluon.loss.L2Loss(), train_metrics=mx.metric.RMSE(),
                          trainer=trainer, context=mx.cpu(), elastic=args.elastic,
                          commit_every=args.commit_every if args.elastic else None,
                          log_interval=args.log_interval, progress=False,
                          output_dir=args.output_dir, resume=args.resume)
    estimator.fit(gluon.data.DataLoader(gluon.data.ArrayDataset(*regression.make_data(960, 1)),
                                        batch_size=args.batch_size, shuffle=True),
                  val_data=gluon.data.DataLoader(
                      gluon.data.ArrayDataset(*regression.make_data(200, 2)),
                      batch_size=args.batch_size),
                  epochs=args.epochs)
    if estimator.rank == 0:
        say(f"validation rmse {estimator.val_metrics[0].get()[1]:.4f} spread "
            f"{regression.make_data(200, 2)[1].std():.4f}")


if __name__ == "__main__":
    main()
