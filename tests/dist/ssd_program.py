"""One rank of GluonCV's SSD (``ssd_300_mobilenet0.25_custom``, ``pretrained_base=False``)
trained by hvdtrain's Estimator at 128 px on synthetic boxes, with
``replica_check='strict'``: GluonCV's own target generator and ``SSDMultiBoxLoss``. Its
``FeatureExpander`` brings 16 BatchNorm moving means and variances in as a SymbolBlock's
auxiliary states (grad_req='null', differentiable): issue 63, finding 7.

Usage: python ssd_program.py OUT_DIR [EPOCHS] (under a launcher)

Writes OUT_DIR/rank<R>.npz (every array at the end, ``own:<name>`` the FeatureExpander
statistics as this rank held them after its last step, before the epoch's end averaged
them) and OUT_DIR/rank<R>.json (the digests at each epoch's end, steps, the statistics'
names).
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()  # GluonCV lives apart from the venv
from gluoncv import model_zoo  # noqa: E402
from gluoncv.loss import SSDMultiBoxLoss  # noqa: E402
from gluoncv.model_zoo.ssd.target import SSDTargetGenerator  # noqa: E402

from hvdtrain.estimator import BatchEnd, BatchProcessor, Estimator  # noqa: E402
from program_parts import EpochDigests, arrays_of  # noqa: E402

SIZE, TRAIN, BATCH, BOXES, SEED = 128, 16, 4, 2, 5
CLASSES = ["a", "b"]


def boxes(count, seed):
    """`count` images, each with BOXES boxes whose class shows as a brighter patch."""
    rng = np.random.RandomState(seed)
    images = rng.uniform(0, 0.3, (count, 3, SIZE, SIZE)).astype(np.float32)
    labels = np.zeros((count, BOXES, 5), np.float32)
    for i in range(count):
        for b in range(BOXES):
            x0, y0 = rng.randint(0, SIZE // 2, 2)
            w, h = rng.randint(SIZE // 6, SIZE // 2, 2)
            cls = rng.randint(0, len(CLASSES))
            images[i, cls, y0:y0 + h, x0:x0 + w] += 0.5
            labels[i, b] = [x0, y0, x0 + w, y0 + h, cls]
    return gluon.data.ArrayDataset(images, labels)


def expander_statistics(net):
    return {name: p for name, p in net._collect_params_with_prefix().items()  # pylint: disable=protected-access
            if name.startswith("features.") and ("moving_" in name or "running_" in name)
            and "expand" in name}


class Detections(BatchProcessor):
    """GluonCV's SSD step: targets from the anchors the net gives in training, then
    SSDMultiBoxLoss; the loss per sample is the batch's."""

    def __init__(self):
        self.targets = SSDTargetGenerator(iou_thresh=0.5, stds=(0.1, 0.1, 0.2, 0.2),
                                           negative_mining_ratio=-1)
        self.loss = SSDMultiBoxLoss()

    def fit_batch(self, estimator, batch, batch_axis=0):
        data, label = (part.as_in_context(estimator.context[0]) for part in batch)
        with autograd.record():
            cls_preds, box_preds, anchors = estimator.net(data)
            with autograd.pause():
                cls_targets, box_targets, _ = self.targets(
                    anchors, None, label.slice_axis(axis=-1, begin=0, end=4),
                    label.slice_axis(axis=-1, begin=4, end=5))
            total, _, _ = self.loss([cls_preds], [box_preds], [cls_targets], [box_targets])
        estimator.backward(total)
        return [data], [label], [cls_preds], total


class OwnStatistics(BatchEnd):
    """The FeatureExpander statistics as this rank holds them after each step (each
    rank's own until the epoch's end averages them): the last step's are kept."""

    def __init__(self):
        self.own = {}

    def batch_end(self, estimator, *args, **kwargs):
        self.own = {name: p.data().asnumpy()
                    for name, p in expander_statistics(estimator.net).items()}


def main():
    out = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    mx.random.seed(SEED)
    net = model_zoo.get_model("ssd_300_mobilenet0.25_custom", classes=CLASSES,
                              pretrained_base=False)
    net.initialize()  # MXNet's default, as GluonCV's train_ssd.py leaves it
    net(mx.nd.zeros((1, 3, SIZE, SIZE)))
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.01, "momentum": 0.9, "wd": 5e-4})
    estimator = Estimator(net, gluon.loss.L2Loss(), trainer=trainer, train_metrics=[],
                          batch_processor=Detections(), log_interval=0,
                          replica_check="strict")
    digests, own = EpochDigests(), OwnStatistics()
    estimator.fit(gluon.data.DataLoader(boxes(TRAIN, 1 + estimator.rank * 0),
                                        batch_size=BATCH, shuffle=True),
                  epochs=epochs, event_handlers=[digests, own])
    arrays = arrays_of(net)
    arrays.update({f"own:{name}": value for name, value in own.own.items()})
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays)
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump({"digests": digests.digests, "statistics": sorted(own.own),
                   "steps": estimator.state.step}, dump)


if __name__ == "__main__":
    main()
