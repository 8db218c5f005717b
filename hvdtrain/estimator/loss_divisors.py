"""What a loss's gradient is already divided by, for the losses hvdtrain recognises.

The rule is :mod:`hvdtrain.loop.engine.divisors`'s: a batch processor's ``loss_divisor(batch,
out)`` says what each micro-batch's gradient was divided by; the engine makes the gradients
sums again before the exchange and divides the step by the divisors summed over the ranks.
A processor that does not declare it gets one here when its losses are recognised:

================================================  =========================================
GluonCV loss (matched by module and class name)    its gradient is divided by
================================================  =========================================
``SoftmaxCrossEntropyLoss(size_average=True)``,    the call's labels that are not
``MixSoftmaxCrossEntropyLoss`` (``aux`` or not,    ``ignore_label``, per call (one per device
not ``mixup``), ``SegmentationMultiLosses``,       part): MXNet's ``SoftmaxOutput``
``ICNetLoss``                                      (``normalization='valid'``), every head
                                                   against the same label
``SSDMultiBoxLoss``                                the positive anchors (``cls_target > 0``)
                                                   of every device part of the call
================================================  =========================================

Recognised where the Estimator's parts are: its ``loss``, or a loss held as an attribute of
the batch processor (``self.mbox_loss``; SSDMultiBoxLoss is a Block, not a ``Loss``, so it
cannot be the Estimator's ``loss``). A hook on each (Gluon's forward pre-hook, recording only
inside ``fit_batch``) queues the count of the call's own labels; it is read after
``fit_batch``, which waits for the labels, not for the pass. ``size_average=False`` and
``mixup=True`` are per-sample losses: nothing to do. hvdtrain never imports GluonCV.

Refused in one line when the Estimator is made, unless the processor declares
``loss_divisor``: a subclass of those GluonCV losses that computes its loss itself (its own
``hybrid_forward`` or ``forward``: what it divides by cannot be told), and GluonCV's OHEM
losses at ``size_average=True`` (they keep the hard pixels only, which hvdtrain cannot
count). Refused at the first batch: a loss of another kind whose graph divides its
own gradient by a count of the batch (MXNet's ``SoftmaxOutput`` or ``MakeLoss`` with
``normalization='valid'`` or ``'batch'``), which no shape check can tell from a per-sample
loss (:func:`self_normalising`).
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional

import mxnet as mx
from mxnet import gluon

from ..config import ConfigError
from ..ecosystem import (GLUONCV, GLUONCV_OHEM as OHEM, GLUONCV_SOFTMAX_BASE as SOFTMAX_BASE,
                         GLUONCV_SOFTMAX_FAMILY as SOFTMAX_FAMILY, GLUONCV_SSD_LOSS as SSD,
                         SOFTMAX_IGNORE_LABEL, SOFTMAX_MIXUP, SOFTMAX_SIZE_AVERAGE,
                         SOFTMAX_SPARSE_LABEL)


def _gluoncv_classes(obj) -> List[str]:
    """The names of GluonCV classes among `obj`'s class and bases, most derived first."""
    return [cls.__name__ for cls in type(obj).__mro__
            if cls.__module__.split(".")[0] == GLUONCV]


def _defined_by(obj, method: str) -> Optional[type]:
    """The class of `obj`'s MRO that defines `method`."""
    return next((cls for cls in type(obj).__mro__ if method in vars(cls)), None)


def kind_of(loss) -> Optional[str]:
    """How `loss` divides its gradient: ``'valid'`` (GluonCV's softmax family at
    ``size_average=True``), ``'positives'`` (GluonCV's SSDMultiBoxLoss), or None (a
    per-sample loss, or not one of GluonCV's). Raises ConfigError for a GluonCV softmax
    loss whose own computation cannot be told."""
    names = _gluoncv_classes(loss)
    if SSD in names:
        if _is_gluoncv(_defined_by(loss, "forward"), (SSD,)):
            return "positives"
        raise ConfigError(f"{type(loss).__name__} (a GluonCV SSDMultiBoxLoss) computes its "
                          f"loss itself: hvdtrain cannot tell what its gradient is divided "
                          f"by; declare it in your batch processor's loss_divisor(batch, out)")
    if any(name in OHEM for name in names) and getattr(loss, SOFTMAX_SIZE_AVERAGE, False):
        raise ConfigError(f"{type(loss).__name__} divides its gradient by the hard pixels it "
                          f"keeps, which hvdtrain cannot count: declare them in your batch "
                          f"processor's loss_divisor(batch, out), or pass size_average=False")
    if SOFTMAX_BASE not in names:
        return None
    if not (getattr(loss, SOFTMAX_SIZE_AVERAGE, False)
            and getattr(loss, SOFTMAX_SPARSE_LABEL, False)):
        return None  # 'null' normalisation, or probability labels: per sample
    if getattr(loss, SOFTMAX_MIXUP, False):
        return None  # the mixup path is a log_softmax: per sample
    if not _is_gluoncv(_defined_by(loss, "hybrid_forward"), SOFTMAX_FAMILY):
        raise ConfigError(
            f"{type(loss).__name__} (a GluonCV SoftmaxCrossEntropyLoss) divides its gradient "
            f"by counts of its own that hvdtrain cannot tell: declare them in your batch "
            f"processor's loss_divisor(batch, out), or pass size_average=False")
    return "valid"


def _is_gluoncv(cls, names) -> bool:
    return cls is not None and cls.__module__.split(".")[0] == GLUONCV and \
        cls.__name__ in names


class LossDivisors:
    """The divisors of the recognised losses among `losses`, recorded while armed.

    Parameters
    ----------
    losses : list
        Candidates: the Estimator's loss, the batch processor's attributes.
    devices : list of Context
        The Estimator's devices: a call's part is matched to one by its prediction's context.
    """

    def __init__(self, losses, devices):
        self.devices = list(devices)
        self._armed = False
        self._per_device: Dict[int, list] = {}  # device index -> counts recorded on it
        self._whole: List = []  # counts over a whole call (SSDMultiBoxLoss)
        self.recognised = []
        seen = set()
        for loss in losses:
            if not isinstance(loss, gluon.Block) or id(loss) in seen:
                continue
            seen.add(id(loss))
            kind = kind_of(loss)
            if kind is None:
                continue
            self.recognised.append(type(loss).__name__)
            loss.register_forward_pre_hook(self._valid if kind == "valid" else self._positives)

    def __bool__(self) -> bool:
        return bool(self.recognised)

    def arm(self) -> None:
        """Record the calls from now on (a ``fit_batch``), forgetting the last batch's."""
        self._armed, self._per_device, self._whole = True, {}, []

    def disarm(self) -> None:
        self._armed = False

    def _device(self, array) -> int:
        context = getattr(array, "context", None)
        return self.devices.index(context) if context in self.devices else 0

    def _valid(self, block, inputs) -> None:
        if not self._armed:
            return
        # As SoftmaxOutput counts: the label cast to int, compared with ignore_label.
        ignore = int(getattr(block, SOFTMAX_IGNORE_LABEL))
        counted = (mx.nd.cast(inputs[-1], "int32") != ignore).sum()
        self._per_device.setdefault(self._device(inputs[0]), []).append(counted)

    def _positives(self, block, inputs) -> None:
        if not self._armed:
            return
        targets = inputs[2] if isinstance(inputs[2], (list, tuple)) else [inputs[2]]
        self._whole.append(mx.nd.add_n(*[(t > 0).sum().as_in_context(mx.cpu())
                                         for t in targets]))

    def divisor(self, out, who: str):
        """The batch's divisor from the calls recorded (see ``loss_divisor``): a number for
        a whole-batch count, one per device part of `out` for per-call counts; None when no
        recognised loss ran."""
        if self._whole and self._per_device:
            raise ConfigError(f"{who} ran losses that divide by counts of different kinds "
                              f"({', '.join(self.recognised)}): declare loss_divisor")
        if self._whole:
            counts = {float(c.asscalar()) for c in self._whole}
            if len(counts) > 1:
                raise ConfigError(f"{who} called SSDMultiBoxLoss more than once on different "
                                  f"targets: declare loss_divisor")
            return counts.pop()
        if not self._per_device:
            return None
        parts = out[3] if isinstance(out[3], (list, tuple)) else [out[3]]
        factors = []
        for part in parts:
            counts = {float(c.asscalar()) for c in self._per_device.get(self._device(part), [])}
            if len(counts) != 1:
                raise ConfigError(
                    f"{who}: a device part's loss was computed by {len(counts)} calls of "
                    f"{', '.join(self.recognised)} with different label counts (or none): no "
                    f"one count divides its gradient; declare loss_divisor")
            factors.append(counts.pop())
        return factors


NORMALISING_OPS = ("SoftmaxOutput", "Softmax", "MakeLoss", "make_loss")


def self_normalising(loss, inputs: int) -> Optional[str]:
    """The name of an operator in `loss`'s graph (a HybridBlock called with `inputs`
    arrays) that divides the gradient by a count of the batch (``normalization='valid'`` or
    ``'batch'``), or None: none found, or the graph cannot be built (a plain Block)."""
    if not isinstance(loss, gluon.HybridBlock):
        return None
    try:
        params = {name: mx.sym.var(name) for name in getattr(loss, "_reg_params", {})}
        graph = loss.hybrid_forward(mx.sym, *[mx.sym.var(f"in{i}") for i in range(inputs)],
                                    **params)
        nodes = json.loads(mx.sym.Group(graph if isinstance(graph, (list, tuple))
                                        else [graph]).tojson())["nodes"]
    except Exception:  # pylint: disable=broad-except
        return None  # not a graph of symbols: nothing can be told
    for node in nodes:
        if node.get("op") in NORMALISING_OPS and \
                (node.get("attrs") or {}).get("normalization") in ("valid", "batch"):
            return f"{node['op']}(normalization='{node['attrs']['normalization']}')"
    return None


class DivisorSource:
    """Where an Estimator's batch processor gets its ``loss_divisor``: the processor's own
    (declared), else the recognised losses' (:class:`LossDivisors`), else none (per-sample
    losses: ``divides`` False).

    Parameters
    ----------
    processor : BatchProcessor
        The user's processor.
    estimator : Estimator
        Its ``loss`` and ``context``.
    """

    def __init__(self, processor, estimator):
        self.who = f"{type(processor).__name__}.fit_batch"
        self.declared = getattr(processor, "loss_divisor", None)
        candidates = [estimator.loss, *vars(processor).values()]
        self.recorded = LossDivisors(candidates if self.declared is None else [],
                                     estimator.context)
        self.divides = self.declared is not None or bool(self.recorded)
        self._loss = estimator.loss
        self._checked = self.divides  # the first batch's graph check, for per-sample ones

    def around(self, fit_batch):
        """Run ``fit_batch()`` with the recognised losses recording."""
        self.recorded.arm()
        try:
            return fit_batch()
        finally:
            self.recorded.disarm()

    def divisor(self, batch, out):
        """This batch's divisor (a number, or a list of one per device part), None when
        the losses are per-sample. Read on the host: waits for the labels, not the pass."""
        if not self._checked:
            self._checked = True
            found = self_normalising(self._loss, 2)
            if found is not None:
                raise ConfigError(
                    f"the loss {type(self._loss).__name__} divides its gradient by a count of "
                    f"the batch ({found}), which each rank would take over its own share: "
                    f"declare that count in your batch processor's loss_divisor(batch, out) "
                    f"(docs/estimator.md, Batch processors), or use a per-sample loss")
        if not self.divides:
            return None
        value = self.declared(batch, out) if self.declared is not None else \
            self.recorded.divisor(out, self.who)
        if value is None:  # every rank's step divides alike, so every batch says it
            raise ConfigError(
                f"{self.who}: " + ("loss_divisor returned None: return the count the batch's "
                                   "gradient is divided by (0 for none)"
                                   if self.declared is not None else
                                   f"none of the losses recognised "
                                   f"({', '.join(self.recorded.recognised)}) ran in it: "
                                   f"declare loss_divisor(batch, out)"))
        if isinstance(value, mx.nd.NDArray):
            value = value.asnumpy().tolist()
        if isinstance(value, (list, tuple)):
            return [float(v.asscalar() if isinstance(v, mx.nd.NDArray) else v) for v in value]
        return float(value)
