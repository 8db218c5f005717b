"""Bring your own Gluon block and your own data to hvdtrain.

    horovodrun -np 2 -H localhost:2 python examples/custom_model.py
    horovodrun -np 2 -H localhost:2 python examples/custom_model.py --data-dir DIR

Without --data-dir the data is made up (points on two interleaved spirals, drawn as 1x8x8
images of their coordinates); swap in any arrays of shape (N, C, H, W) and integer labels.
With it, DIR is your images: train/<class>/*.jpg and val/<class>/* (an image folder, read by
Gluon's ImageFolderDataset), or train.rec/.idx and val.rec/.idx (a pack made by
hvdtrain-pack or im2rec, read by Gluon's ImageRecordDataset). Either way the code is MXNet
Estimator code; hvdtrain's Estimator gives each rank its share (docs/estimator.md).
"""
import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon import nn
from mxnet.gluon.data.vision import ImageFolderDataset, ImageRecordDataset, transforms

import hvdtrain


class TinyResidual(nn.HybridBlock):
    """Your model: any HybridBlock whose output has one column per class."""

    def __init__(self, classes, **kwargs):
        super().__init__(**kwargs)
        self.stem = nn.Conv2D(16, 3, padding=1, activation="relu")
        self.body = nn.Conv2D(16, 3, padding=1)
        self.head = nn.Dense(classes)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        stem = self.stem(x)
        return self.head(F.relu(stem + self.body(stem)))


def spirals(count, seed):
    """Your data: images as float32 (N, C, H, W), labels as int32."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=count)
    angle = rng.uniform(0.5, 3 * np.pi, size=count)
    x = angle * np.cos(angle + np.pi * labels) + rng.normal(0, 0.3, count)
    y = angle * np.sin(angle + np.pi * labels) + rng.normal(0, 0.3, count)
    features = np.stack([x, y] * 32, axis=1)[:, :64] / 10.0
    return features.reshape(count, 1, 8, 8).astype(np.float32), labels.astype(np.int32)


def pack_classes(prefix):
    """How many classes a pack's labels count (read from the record headers alone)."""
    record = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "r")
    labels = [mx.recordio.unpack(record.read_idx(key))[0].label for key in record.keys]
    return int(max(labels)) + 1


def image_splits(data_dir):
    """(train, val, number of classes, kind) of a folder or a pack, as 3x32x32 tensors."""
    to_tensor = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32),
                                    transforms.ToTensor()])
    if os.path.exists(os.path.join(data_dir, "train.rec")):
        train = ImageRecordDataset(os.path.join(data_dir, "train.rec"))
        val = ImageRecordDataset(os.path.join(data_dir, "val.rec"))
        classes = pack_classes(os.path.join(data_dir, "train"))
        kind = "recordio"
    else:
        train = ImageFolderDataset(os.path.join(data_dir, "train"))
        val = ImageFolderDataset(os.path.join(data_dir, "val"))
        classes, kind = len(train.synsets), "imagefolder"
    return (train.transform_first(to_tensor), val.transform_first(to_tensor), classes, kind)


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--max-steps", type=int)
parser.add_argument("--data-dir", help="an image folder or a RecordIO pack")
args = parser.parse_args()

if args.data_dir:
    try:
        train, val, num_classes, name = image_splits(args.data_dir)
    except (OSError, RuntimeError, mx.MXNetError) as err:
        parser.exit(2, f"{parser.prog}: error: --data-dir {args.data_dir}: {err}\n")
else:
    train = gluon.data.ArrayDataset(*spirals(2000, seed=1))
    val = gluon.data.ArrayDataset(*spirals(500, seed=2))
    num_classes, name = 2, "spirals"

net = TinyResidual(classes=num_classes)
net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
estimator = hvdtrain.Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(),
                               train_metrics=mx.metric.Accuracy(), trainer=trainer,
                               context=mx.cpu(), max_steps=args.max_steps, log_interval=0)
estimator.fit(gluon.data.DataLoader(train, batch_size=32, shuffle=True),
              val_data=gluon.data.DataLoader(val, batch_size=32), epochs=args.epochs)
if estimator.rank == 0:
    accuracy = estimator.val_metrics[0].get()[1]
    print(f"test accuracy {accuracy:.4f} on {estimator.val_count} images of "
          f"{num_classes} classes ({name})")
