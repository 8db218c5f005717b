"""One rank of GluonCV's CIFAR ResNet-20 trained by hvdtrain's Estimator as GluonCV's CIFAR
script trains it (hybridized, NAG with momentum 0.9 and weight decay 1e-4, GluonCV's
RandomCrop(32, pad=4) and a flip, validation after each epoch), on CIFAR-shaped synthetic
images, with MXNet's default threaded engine and MKL-DNN. It records a digest of every
trained array after every step, for test_replica_drift.py.

Usage: python resnet20_program.py OUT_DIR [OPTION=VALUE ...] (under a launcher)

Options are RunConfig fields passed to the Estimator (numbers parsed) and the program's own:
``epochs=N`` (3), ``train=N`` (512 images), ``model=NAME`` (GluonCV's model zoo name).
Writes OUT_DIR/rank<R>.json: the digest of the trained arrays after each step and of every
array at each epoch's end, the validation figures this rank reported at each epoch's end
(``Accuracy``, ``Loss``), and OUT_DIR/rank<R>.npz: every array at the end.
"""
import hashlib
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon.data.vision import transforms

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()  # GluonCV and GluonNLP live apart from the venv
from gluoncv.data import transforms as gcv_transforms
from gluoncv.model_zoo import get_model

from hvdtrain.estimator import BatchEnd, Estimator, EpochEnd
from program_parts import options as options_of  # noqa: E402

BATCH, VAL, SEED = 16, 128, 7


def images(count, seed):
    """CIFAR-shaped uint8 images whose class shows as a brighter channel, and labels."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, count)
    pixels = rng.randint(0, 160, (count, 32, 32, 3))
    pixels[np.arange(count), :, :, labels % 3] += 8 * labels[:, None, None]
    return gluon.data.ArrayDataset(mx.nd.array(pixels, dtype="uint8"),
                                   labels.astype(np.float32))


def validation_set():
    """The validation images as GluonCV's CIFAR script transforms them."""
    normalize = transforms.Normalize([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010])
    return images(VAL, 2).transform_first(transforms.Compose([transforms.ToTensor(),
                                                              normalize]))


def trained_digest(net, statistics=False) -> str:
    """A digest of the bytes of every trained array (and with `statistics` BatchNorm's
    running statistics, which each rank moves with its own batches until the epoch's end),
    in a fixed order."""
    digest = hashlib.sha256()
    for name, param in sorted(net._collect_params_with_prefix().items()):  # pylint: disable=protected-access
        if param.grad_req == "null" and not statistics:
            continue
        digest.update(name.encode())
        digest.update(param.data().asnumpy().tobytes())
    return digest.hexdigest()[:16]


class StepDigests(BatchEnd, EpochEnd):
    """The digest of every trained array after each step; at each epoch's end the digest of
    every array (running statistics included: averaged by then) and the validation figures,
    as this rank sees them."""

    def __init__(self, net, val_metrics):
        self.net, self.val_metrics = net, val_metrics
        self.digests, self.epoch_digests, self.val = [], [], []

    def batch_end(self, estimator, *args, **kwargs):
        self.digests.append(trained_digest(self.net))

    def epoch_end(self, estimator, *args, **kwargs):
        self.epoch_digests.append(trained_digest(self.net, statistics=True))
        self.val.append({m.name: float(m.get()[1]) for m in self.val_metrics})


def main():
    out = sys.argv[1]
    options = options_of(sys.argv[2:])
    epochs = options.pop("epochs", 3)
    train_size = options.pop("train", 512)
    model = options.pop("model", "cifar_resnet20_v1")
    mx.random.seed(SEED)
    np.random.seed(SEED)
    normalize = transforms.Normalize([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010])
    train_transform = transforms.Compose([gcv_transforms.RandomCrop(32, pad=4),
                                          transforms.RandomFlipLeftRight(),
                                          transforms.ToTensor(), normalize])
    net = get_model(model, classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "nag",
                            {"learning_rate": 0.1, "wd": 1e-4, "momentum": 0.9})
    # GluonCV's CIFAR script's metrics, as MXNet's Fit API tutorial gives them.
    estimator = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(),
                          train_metrics=[mx.metric.Accuracy(), mx.metric.Loss()],
                          val_metrics=[mx.metric.Accuracy(), mx.metric.Loss()], trainer=trainer,
                          **options)
    watch = StepDigests(net, estimator.val_metrics)
    train = gluon.data.DataLoader(images(train_size, 1).transform_first(train_transform),
                                  batch_size=BATCH, shuffle=True, last_batch="keep")
    val = gluon.data.DataLoader(validation_set(), batch_size=BATCH)
    estimator.fit(train, val_data=val, epochs=epochs, event_handlers=[watch])
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays)
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump({"digests": watch.digests, "epoch_digests": watch.epoch_digests,
                   "val": watch.val, "val_count": estimator.val_count,
                   "result": estimator.result}, dump)


if __name__ == "__main__":
    main()
