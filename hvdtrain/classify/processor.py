"""Image classification as a batch processor of the one engine: what the ``hvdtrain``
command trains with.

Its batches are hvdtrain's loaders' numpy pairs ``(images, labels)`` (an empty pair when
every image of a rank's batch was unusable). Training: softmax cross-entropy against the
labels, or against ``--label-smoothing``'s targets, or (``--mixup``/``--cutmix``) against
the mixed targets of a batch mixed with itself; what it reports as each sample's label is
then the dominant one (the accuracy it measures is agreement with it). Evaluation: plain
softmax cross-entropy. Its metrics stay on the device (:mod:`hvdtrain.loop.engine
.device_metrics`): accuracy in training; accuracy, top-5 and the loss in evaluation.
"""
from __future__ import annotations

from typing import List, Optional

import mxnet as mx
from mxnet import autograd, gluon

from ..estimator.batch_processor import BatchProcessor
from ..loop.engine.batches import split_batch
from ..loop.engine.draws import blocks_draw
from ..loop.engine.device_metrics import DeviceAccuracy, DeviceLoss, DeviceTopK
from ..loop.recipe.mixing import MEASURES, Mixing, mixed_batch


def training_loss(smoothing: float):
    """Softmax cross-entropy against the labels, or (`smoothing` > 0) against targets of
    ``1 - smoothing + smoothing / classes`` for the true class and ``smoothing / classes``
    for every other (GluonCV's ``--label-smoothing``)."""
    if not smoothing:
        return gluon.loss.SoftmaxCrossEntropyLoss()
    dense = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def smoothed(out, label):
        classes = out.shape[1]
        target = mx.nd.one_hot(label, classes, on_value=1 - smoothing + smoothing / classes,
                               off_value=smoothing / classes)
        return dense(out, target.astype(out.dtype, copy=False))
    return smoothed


def train_metrics() -> List:
    """What the command measures in training: accuracy (``train_acc``)."""
    return [DeviceAccuracy("accuracy", record_name="acc", log_name="train acc")]


def val_metrics() -> List:
    """What the command measures in evaluation: accuracy, top-5 and the loss (``test_acc``,
    ``test_top5``, ``test_loss``; the epoch's line names the first two)."""
    return [DeviceAccuracy("accuracy", record_name="acc", log_name="test acc"),
            DeviceTopK(5, "top-5", record_name="top5", log_name="top-5"),
            DeviceLoss("loss", record_name="loss", log_name="")]


class ClassifierProcessor(BatchProcessor):
    """Image classification over ``(images, labels)`` numpy batches (see the module).

    Parameters
    ----------
    smoothing : float
        ``--label-smoothing``.
    mixing : Mixing, optional
        ``--mixup``/``--cutmix``: batches of its active epochs are mixed, with draws from
        (seed, epoch, the batch's position, rank), so a resume repeats them.
    dtype : str
        The model's input dtype (the batch is cast on the device).
    """

    def __init__(self, smoothing: float = 0.0, mixing: Optional[Mixing] = None,
                 dtype: str = "float32"):
        super().__init__()
        self.loss = training_loss(smoothing)
        self.eval_loss = gluon.loss.SoftmaxCrossEntropyLoss()
        self.mixing = mixing
        self.dtype = dtype

    def batch_samples(self, batch, batch_axis: int = 0) -> int:
        return len(batch[1])

    @property
    def draws_random(self):
        """Whether ``fit_batch`` draws from MXNet's generators besides the net: only if a
        loss does (mixing draws from its own NumPy generator)."""
        return blocks_draw(self.loss, self.mixing.loss if self.mixing is not None else None)

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        images, labels = train_batch
        state = estimator.state
        mixing = self.mixing if self.mixing is not None and \
            self.mixing.active(state.epoch) else None
        if mixing is None:
            xs, ys, _ = split_batch(images, labels, estimator.context, self.dtype)
            targets, loss_fn = ys, self.loss
        else:
            # Drawn from where the batch starts in the epoch's order: a resume repeats it.
            draw = mixing.draw(state.epoch, state.epoch_samples, estimator.rank,
                               *images.shape[2:])
            xs, targets, ys, _ = mixed_batch(mixing, draw, images, labels, estimator.context,
                                             self.dtype)
            loss_fn = mixing.loss
        with autograd.record():
            outs = [estimator.net(x) for x in xs]
            losses = [loss_fn(o, t) for o, t in zip(outs, targets)]
        estimator.backward(losses)
        return xs, ys, outs, losses

    def evaluate_batch(self, estimator, val_batch, batch_axis=0):
        images, labels = val_batch
        xs, ys, _ = split_batch(images, labels, estimator.context, self.dtype)
        outs = [estimator.val_net(x) for x in xs]
        return xs, ys, outs, [self.eval_loss(o, y) for o, y in zip(outs, ys)]

    def epoch_figures(self, epoch: int) -> dict:
        """What an epoch's record adds: what ``train_acc`` counted (each sample's label, or
        a mixed sample's dominant one)."""
        mixed = self.mixing is not None and self.mixing.active(epoch)
        return {"train_acc_measures": MEASURES[mixed]}


class StepContext:
    """What :class:`ClassifierProcessor` reads of "the estimator" (the model, its devices,
    this rank, the position and the backward pass), for programs that drive the engine's
    epoch (:func:`~hvdtrain.loop.engine.epoch.train_epoch`) themselves: benchmarks, tests.

    Parameters
    ----------
    net, trainer, devices, dist
        The model, its trainer, this rank's devices and its layout.
    policy : Precision
        The backward pass goes through it (AMP's loss scaling).
    state : TrainState
        The position the engine advances (mixing's draws follow it).
    """

    def __init__(self, net, trainer, devices, dist, policy, state):
        self.net = self.val_net = net
        self.trainer, self.context, self.dist = trainer, devices, dist
        self.policy, self.state = policy, state

    @property
    def rank(self) -> int:
        return self.dist.rank

    def backward(self, losses) -> None:
        self.policy.backward(losses, self.trainer)
