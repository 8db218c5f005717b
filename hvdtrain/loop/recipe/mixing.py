"""Mixup and CutMix (``--mixup``, ``--cutmix``): training batches blended with themselves.

As torchvision's reference (``RandomMixup``/``RandomCutmix``, or ``MixUp``/``CutMix`` in
``transforms.v2``): a batch is paired with itself *rolled by one sample* (sample i with
sample i - 1), ``lam ~ Beta(alpha, alpha)`` and

- mixup: ``images = lam * images + (1 - lam) * rolled``;
- cutmix: a box around a uniformly drawn centre, of half-sides ``0.5 * sqrt(1 - lam)`` times
  the image's sides (clipped at its edges), is pasted from the rolled batch, and ``lam``
  becomes the share of each image left unpasted;
- targets: ``lam * smooth(labels) + (1 - lam) * smooth(rolled labels)``, where ``smooth`` is
  ``--label-smoothing``'s one-hot (1 - e + e / classes, e / classes), so the two compose as
  GluonCV's ``mixup_transform`` and torchvision's loss do;
- with both on, each batch takes one of the two, each with probability 1/2.

Each rank mixes its own batch (as each process of torchvision's reference does under DDP):
a batch never borrows samples from another rank. Its draws come from a generator seeded by
``(seed, epoch, the batch's position in the epoch, rank)``: they depend neither on the data
threads nor on where a run was stopped and resumed. A batch a streamed loader shrank (an
unusable sample left out) mixes the samples it has; one of a single sample is mixed with
itself, i.e. left as it is.

Training accuracy under mixed targets counts agreement with each sample's *dominant* label
(the one its target weights more; its own on a tie), as torchvision's ``utils.accuracy``
does with soft targets; the metrics say so (``train_acc_measures``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import mxnet as mx
import numpy as np
from mxnet import gluon

# Told apart from the augmentation streams, which are seeded by (seed, epoch, sample) and
# (seed, epoch, part, batch): "mix" in ASCII.
MIX_STREAM = 0x6D6978
MEASURES = {False: "label", True: "dominant label"}  # what train_acc counts


@dataclass(frozen=True)
class MixDraw:
    """The random numbers one batch is mixed with.

    Attributes
    ----------
    kind : {'mixup', 'cutmix'}
    lam : float
        The Beta(alpha, alpha) draw: the weight of the batch itself (for cutmix, before the
        box is clipped at the image's edges).
    centre : (int, int)
        Cutmix's box centre, (row, column) in pixels; unused by mixup.
    """

    kind: str
    lam: float
    centre: Tuple[int, int] = (0, 0)


def cutmix_box(lam: float, centre: Tuple[int, int], height: int, width: int):
    """(top, bottom, left, right) of the pasted box and the share of the image left
    unpasted, torchvision's rule: half-sides ``int(0.5 * sqrt(1 - lam) * side)``."""
    half = 0.5 * math.sqrt(1.0 - lam)
    half_h, half_w = int(half * height), int(half * width)
    top, bottom = max(centre[0] - half_h, 0), min(centre[0] + half_h, height)
    left, right = max(centre[1] - half_w, 0), min(centre[1] + half_w, width)
    kept = 1.0 - (bottom - top) * (right - left) / float(height * width)
    return (top, bottom, left, right), kept


class Mixing:
    """Draws and applies mixup/cutmix for one run.

    Parameters
    ----------
    mixup, cutmix : float
        Their Beta alphas (0: that one is off; at least one must be on).
    off_epoch : int or None
        Epochs (counted from 0) from this one on train on plain batches.
    seed : int
    classes : int
        Width of the targets.
    smoothing : float
        ``--label-smoothing``'s e, applied to both labels of a mixed target.
    """

    def __init__(self, mixup: float, cutmix: float, off_epoch: Optional[int], seed: int,
                 classes: int, smoothing: float = 0.0):
        if not (mixup or cutmix) or min(mixup, cutmix) < 0:
            raise ValueError(f"mixup {mixup} and cutmix {cutmix}: at least one positive, "
                             f"neither negative")
        self.mixup, self.cutmix = float(mixup), float(cutmix)
        self.off_epoch = off_epoch
        self.seed, self.classes, self.smoothing = int(seed), int(classes), float(smoothing)
        self.loss = soft_target_loss()  # what a mixed batch trains on

    @classmethod
    def of(cls, cfg, classes: int) -> Optional["Mixing"]:
        """The run's mixing (None when neither ``--mixup`` nor ``--cutmix`` is on)."""
        if not (cfg.mixup or cfg.cutmix):
            return None
        return cls(cfg.mixup, cfg.cutmix, cfg.mix_off_epoch, cfg.seed, classes,
                   cfg.label_smoothing)

    def active(self, epoch: int) -> bool:
        """Whether batches of `epoch` (counted from 0) are mixed."""
        return self.off_epoch is None or epoch < self.off_epoch

    def draw(self, epoch: int, position: int, rank: int, height: int, width: int) -> MixDraw:
        """The draws of the batch that starts at `position` of `epoch`'s order (positions
        all workers consumed before it) on `rank`, for images of `height` x `width`."""
        rng = np.random.default_rng([self.seed, epoch, position, rank, MIX_STREAM])
        use_cutmix = self.cutmix > 0 and (not self.mixup or rng.random() < 0.5)
        alpha = self.cutmix if use_cutmix else self.mixup
        lam = float(rng.beta(alpha, alpha))
        if not use_cutmix:
            return MixDraw("mixup", lam)
        return MixDraw("cutmix", lam, (int(rng.integers(height)), int(rng.integers(width))))

    def targets(self, labels: mx.nd.NDArray) -> mx.nd.NDArray:
        """`labels` as (smoothed) one-hot rows, float32."""
        e = self.smoothing
        return mx.nd.one_hot(labels, self.classes, on_value=1 - e + e / self.classes,
                             off_value=e / self.classes)

    def mix(self, images: mx.nd.NDArray, labels: mx.nd.NDArray, draw: MixDraw):
        """Mix one batch on its device.

        Returns
        -------
        (NDArray, NDArray, NDArray)
            The mixed images, their soft targets ``(batch, classes)`` and each sample's
            dominant label (float32, as the training labels are).
        """
        rolled_images, rolled_labels = _rolled(images), _rolled(labels)
        lam = draw.lam
        if draw.kind == "mixup":
            mixed = images * lam + rolled_images * (1.0 - lam)
        else:
            (top, bottom, left, right), lam = cutmix_box(lam, draw.centre, *images.shape[2:])
            mixed = images.copy()
            if bottom > top and right > left:
                mixed[:, :, top:bottom, left:right] = rolled_images[:, :, top:bottom, left:right]
        target = self.targets(labels) * lam + self.targets(rolled_labels) * (1.0 - lam)
        dominant = labels if lam >= 0.5 else rolled_labels
        return mixed, target, dominant


def _rolled(batch: mx.nd.NDArray) -> mx.nd.NDArray:
    """`batch` rolled by one along its first axis: row i holds row i - 1 (torch.roll(1, 0))."""
    if batch.shape[0] < 2:
        return batch
    return mx.nd.concat(batch[batch.shape[0] - 1:], batch[:batch.shape[0] - 1], dim=0)


def mixed_batch(mixing: Mixing, draw: MixDraw, images: np.ndarray, labels: np.ndarray,
                devices, dtype: str = "float32"):
    """One numpy batch mixed as a whole on the worker's first device, then split over its
    devices as :func:`~hvdtrain.loop.engine.batches.split_batch` splits a plain one.

    Returns
    -------
    (list of NDArray, list of NDArray, list of NDArray, list of Context)
        Images, soft targets and dominant labels per used device, and the idle devices.
    """
    used = devices[:max(1, min(len(devices), len(labels)))]
    x = mx.nd.array(images, ctx=devices[0], dtype=images.dtype).astype(dtype, copy=False)
    y = mx.nd.array(labels, ctx=devices[0], dtype=labels.dtype).astype("float32", copy=False)
    x, target, dominant = mixing.mix(x, y, draw)

    def split(array):
        return gluon.utils.split_and_load(array, used, even_split=False)
    return split(x), split(target), split(dominant), devices[len(used):]


def soft_target_loss():
    """Cross-entropy against soft targets (rows summing to 1), in the output's dtype."""
    dense = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def loss(out, target):
        return dense(out, target.astype(out.dtype, copy=False))
    return loss
