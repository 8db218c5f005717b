"""ResNet-18 on CIFAR-10 with Horovod, written as MXNet Estimator code.

    horovodrun -np 4 -H localhost:4 python examples/cifar10_resnet18.py \
        --data-dir ~/data/cifar-10-batches-bin --epochs 5

The `hvdtrain` command does the same with more options; this is the whole story on a page:
a Gluon model, loss, metric, Trainer and DataLoaders as MXNet's Estimator examples write
them, and :class:`hvdtrain.Estimator` in place of MXNet's. It gives each rank its share of
every epoch, starts every rank from rank 0's weights, averages the gradients over the
global batch and sums the metrics over the ranks (docs/estimator.md).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import gluon

import hvdtrain

MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32).reshape(3, 1, 1)


def normalise(image):
    """uint8 (3, 32, 32) to float32, per channel."""
    return (image.astype(np.float32) / 255 - MEAN) / STD


def augment(image, label):
    """The usual CIFAR-10 augmentation: a 32x32 crop of the image padded by 4, flipped
    left-right half the time (each data worker draws its own)."""
    padded = np.pad(image, ((0, 0), (4, 4), (4, 4)))
    top, left = np.random.randint(0, 9, size=2)
    crop = padded[:, top:top + 32, left:left + 32]
    if np.random.rand() < 0.5:
        crop = crop[:, :, ::-1]
    return normalise(crop), label


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--data-dir", required=True, help="CIFAR-10 binary files")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--lr", type=float, default=0.1, help="for the global batch")
parser.add_argument("--max-steps", type=int)
parser.add_argument("--output-dir", help="checkpoints and metrics.jsonl; resumes when given")
parser.add_argument("--no-cuda", action="store_true")
args = parser.parse_args()

try:  # missing or truncated data files: one line, exit 2
    data = hvdtrain.load_dataset("cifar10", args.data_dir)   # uint8 (N, 3, 32, 32) arrays
except hvdtrain.ConfigError as err:
    parser.exit(2, f"{parser.prog}: error: {err}\n")
train = gluon.data.ArrayDataset(data.train_x, data.train_y).transform(augment)
test = gluon.data.ArrayDataset(data.test_x, data.test_y).transform_first(normalise)

net = gluon.model_zoo.vision.get_model("resnet18_v1", classes=data.num_classes)
net.initialize(mx.init.Xavier(magnitude=2))
net.hybridize(static_alloc=True, static_shape=True)
trainer = gluon.Trainer(net.collect_params(), "sgd",
                        {"learning_rate": args.lr, "momentum": 0.9, "wd": 5e-4})
try:  # a bad option: one line, exit 2
    estimator = hvdtrain.Estimator(
        net, gluon.loss.SoftmaxCrossEntropyLoss(), train_metrics=mx.metric.Accuracy(),
        trainer=trainer, context=mx.cpu() if args.no_cuda else None,
        max_steps=args.max_steps, output_dir=args.output_dir,
        resume="auto" if args.output_dir else None, log_interval=20)
except hvdtrain.ConfigError as err:
    parser.exit(2, f"{parser.prog}: error: {err}\n")
estimator.fit(gluon.data.DataLoader(train, batch_size=args.batch_size, shuffle=True,
                                    num_workers=2),
              val_data=gluon.data.DataLoader(test, batch_size=args.batch_size),
              epochs=args.epochs)
if estimator.rank == 0:
    accuracy = estimator.val_metrics[0].get()[1]
    print(f"test accuracy {accuracy:.4f} on {estimator.val_count} images")
