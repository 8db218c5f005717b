"""A training script in the style of the field's ``horovod.mxnet`` scripts (GluonCV's
train_horovod.py, Horovod's examples/mxnet): a hand loop on ``hvd.DistributedTrainer``, a
net with BatchNorm, a sampler split by rank, validation between epochs, a params file per
rank. Written for the suite; scripts/run_horovod_scripts.py changes its import as it
changes the field's, so it is kept as the field writes it (``import horovod.mxnet``).

    python horovod_field_program.py OUT_DIR [EPOCHS]
"""
import os
import random
import sys

import horovod.mxnet as hvd
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from say import say

hvd.init()
rank, num_workers = hvd.rank(), hvd.size()
out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
batch_size = 8
say(f"rank {rank} of {num_workers}: module {hvd.__name__}")


class SplitSampler(gluon.data.sampler.Sampler):
    """Each rank its own contiguous part, shuffled (as GluonCV's script splits)."""

    def __init__(self, length, num_parts, part_index):
        self.part_len = length // num_parts
        self.start = self.part_len * part_index

    def __iter__(self):
        indices = list(range(self.start, self.start + self.part_len))
        random.shuffle(indices)
        return iter(indices)

    def __len__(self):
        return self.part_len


rng = np.random.RandomState(0)
features = rng.normal(size=(96, 12)).astype("float32")
# Each rank's half drawn differently: its BatchNorm statistics differ unless made equal.
features[48:] = features[48:] * 3 + 2
labels = (features[:, 0] > features[:, 1]).astype("float32")
dataset = gluon.data.ArrayDataset(features, labels)
train_data = gluon.data.DataLoader(dataset, batch_size=batch_size, last_batch="discard",
                                   sampler=SplitSampler(len(dataset), num_workers, rank))
val_data = gluon.data.DataLoader(dataset, batch_size=batch_size,
                                 sampler=SplitSampler(len(dataset), num_workers, rank))

net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(16), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Dense(2))
net.hybridize()
context = mx.cpu(hvd.local_rank())  # GluonCV's scripts: mx.gpu(local_rank)
net.initialize(mx.init.Xavier(), ctx=context)
net(mx.nd.zeros((1, 12), ctx=context))
params = net.collect_params()
hvd.broadcast_parameters(params, root_rank=0)
trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

for epoch in range(epochs):
    metric = mx.metric.Accuracy()
    for data, label in train_data:
        data, label = data.as_in_context(context), label.as_in_context(context)
        with autograd.record():
            output = net(data)
            loss = loss_fn(output, label)
        loss.backward()
        trainer.step(batch_size)
        metric.update([label], [output])
    val = mx.metric.Accuracy()
    for data, label in val_data:
        val.update([label], [net(data.as_in_context(context))])
    say(f"rank {rank} epoch {epoch} train {metric.get()[1]:.3f} val {val.get()[1]:.3f}")
net.save_parameters(os.path.join(out_dir, f"model-rank{rank}.params"))
