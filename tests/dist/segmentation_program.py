"""One rank of GluonCV's Fast-SCNN (with its auxiliary head) trained by hvdtrain's Estimator as
GluonCV's segmentation script trains it: ``MixSoftmaxCrossEntropyLoss(aux=True)``, whose
softmax divides by the valid pixels inside, pixels labelled -1 ignored, and GluonCV's
``SegmentationMetric`` (pixel accuracy and mIoU over summed intersections and unions) on the
validation split. For test_ecosystem_segmentation.py.

Usage: python segmentation_program.py OUT_DIR [OPTION=VALUE ...] (under a launcher)

Writes OUT_DIR/rank0-start.npz (rank 0, before the first step), OUT_DIR/rank<R>.npz (every
array at the end) and OUT_DIR/rank<R>.json (what ``get()`` of each metric says on this rank,
the digest of every array at each epoch's end, the validation count).
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()  # GluonCV and GluonNLP live apart from the venv
from gluoncv.loss import MixSoftmaxCrossEntropyLoss
from gluoncv.model_zoo.fastscnn import FastSCNN
from gluoncv.utils.metrics import SegmentationMetric

from hvdtrain.estimator import BatchProcessor, Estimator
from program_parts import EpochDigests, arrays_of

CLASSES, SIZE, TRAIN, VAL, BATCH, EPOCHS, SEED = 4, 32, 24, 11, 2, 2, 5


def images(count, seed):
    """`count` images whose pixels' class shows in their colour, labels with a border of
    ignored pixels (-1) whose width varies by image: the valid pixels differ per sample."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, CLASSES, (count, SIZE // 8, SIZE // 8)).repeat(8, 1).repeat(8, 2)
    pixels = rng.uniform(0, 0.5, (count, 3, SIZE, SIZE))
    for c in range(3):
        pixels[:, c] += 0.15 * (labels == c)
    labels = labels.astype(np.float32)
    for k in range(count):
        border = k % 4
        if border:
            labels[k, :border], labels[k, :, :border] = -1, -1
    return gluon.data.ArrayDataset(pixels.astype(np.float32), labels)


def make_net():
    net = FastSCNN(CLASSES, aux=True, height=SIZE, width=SIZE)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, SIZE, SIZE)))
    return net


class Segments(BatchProcessor):
    """GluonCV's segmentation step: the loss over both heads; validation scores the main
    head's prediction."""

    def fit_batch(self, estimator, batch, batch_axis=0):
        data, label = (part.as_in_context(estimator.context[0]) for part in batch)
        with autograd.record():
            outputs = estimator.net(data)
            loss = estimator.loss(*outputs, label)
        estimator.backward(loss)
        return [data], [label], [outputs[0]], [loss]

    def evaluate_batch(self, estimator, batch, batch_axis=0):
        data, label = (part.as_in_context(estimator.context[0]) for part in batch)
        outputs = estimator.val_net(data)
        return [data], [label], [outputs[0]], [estimator.val_loss(*outputs, label)]


def main():
    out = sys.argv[1]
    mx.random.seed(SEED)
    net = make_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4})
    estimator = Estimator(net, MixSoftmaxCrossEntropyLoss(aux=True),
                          val_metrics=[SegmentationMetric(CLASSES)], trainer=trainer,
                          batch_processor=Segments(), log_interval=0)
    if estimator.rank == 0:
        np.savez(os.path.join(out, "rank0-start.npz"), **arrays_of(net))
    digests = EpochDigests()
    estimator.fit(gluon.data.DataLoader(images(TRAIN, 1), batch_size=BATCH, shuffle=True),
                  val_data=gluon.data.DataLoader(images(VAL, 2), batch_size=BATCH),
                  epochs=EPOCHS, event_handlers=[digests])
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays_of(net))
    pixacc, miou = estimator.val_metrics[0].get()  # GluonCV's get(): the two values
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump({"val": {"pixacc": float(pixacc), "miou": float(miou)},
                   "digests": digests.digests,
                   "val_count": estimator.val_count}, dump)


if __name__ == "__main__":
    main()
