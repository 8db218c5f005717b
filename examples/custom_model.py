"""Bring your own Gluon block and your own data to hvdtrain's loop.

    horovodrun -np 2 -H localhost:2 python examples/custom_model.py
    horovodrun -np 2 -H localhost:2 python examples/custom_model.py --data-dir DIR

Without --data-dir the data is made up (points on two interleaved spirals, drawn as 1x8x8
images of their coordinates); swap in any arrays of shape (N, C, H, W) and integer labels.
With it, DIR is your images: train/<class>/*.jpg and val/<class>/* (an image folder), or
train.rec/.idx and val.rec/.idx (a pack made by hvdtrain-pack or im2rec), streamed from disk
(each rank reads only its share; docs/data.md).
"""
import argparse
import os
import sys

import numpy as np
from mxnet.gluon import nn

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


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--max-steps", type=int)
parser.add_argument("--data-dir", help="an image folder or a RecordIO pack")
args = parser.parse_args()

if args.data_dir:
    kind = "recordio" if os.path.exists(os.path.join(args.data_dir, "train.rec")) \
        else "imagefolder"
    try:
        data = hvdtrain.load_images(kind, args.data_dir, image_size=32)
    except hvdtrain.ConfigError as err:
        sys.exit(f"custom_model.py: error: {err}")
    settings = dict(dataset=kind, data_dir=args.data_dir, image_size=32)
else:
    train_x, train_y = spirals(2000, seed=1)
    test_x, test_y = spirals(500, seed=2)
    data = hvdtrain.Dataset("spirals", train_x, train_y, test_x, test_y, num_classes=2)
    settings = dict(dataset="synthetic")
cfg = hvdtrain.TrainConfig(model="TinyResidual", epochs=args.epochs, batch_size=32, lr=0.1,
                           max_steps=args.max_steps, no_cuda=True, log_interval=0,
                           **settings)

dist = hvdtrain.DistContext.from_store(hvdtrain.create_store("horovod"))
hvdtrain.setup_logging(dist.rank)
devices = hvdtrain.select_devices(dist.local_rank, no_cuda=True)
net = TinyResidual(classes=data.num_classes)
hvdtrain.initialize(net, devices, data.image_shape, cfg.seed, dist.rank)
trainer = hvdtrain.build_trainer(net, cfg, dist)
hvdtrain.broadcast_parameters(trainer, cfg.batch_size * dist.num_workers)
result = hvdtrain.fit(net, trainer, data, devices, dist, cfg, hvdtrain.Outputs())
if dist.is_root:
    print(f"test accuracy {result['test_acc']:.4f} on {data.num_test} images of "
          f"{data.num_classes} classes ({data.name})")
