"""What trains when in a fine-tune: the output layer (the head), found by the model's
structure, may learn faster (``--head-lr-mult``), and the rest of the model (the backbone)
may stay frozen for the first epochs (``--freeze-epochs``).

The head is the block a model-zoo net calls ``output``, or else the last layer with
parameters of a sequential net (the small nets end with a Dense). For every model hvdtrain
builds, these are exactly the parameters whose shapes follow the class count
(tests/unit/test_finetune.py checks each name against that independent rule).

A frozen parameter has ``grad_req='null'``: backward computes no gradient for it, and the
Trainer neither reduces nor updates it, so it costs no allreduce. Changing ``grad_req``
re-creates a parameter's gradient arrays, which would leave the zero-copy gradient buckets
(:mod:`hvdtrain.store.buckets`) holding views nobody writes. So at each change the trainer
plans its buckets at once
(:meth:`~hvdtrain.store.buckets.BucketedTrainer.follow_gradients`), over the parameters that
take gradients now, before the next backward pass binds the gradient arrays it is given
(planned at the next step instead, every step copied each gradient in:
tests/unit/test_finetune.py). Every rank changes phase at the same epoch and plans the same
buckets.
"""
from __future__ import annotations

import logging
from typing import Dict

from mxnet import gluon

from ...config import ConfigError, TrainConfig
from ...store.gluon_internals import params_by_place

logger = logging.getLogger("hvdtrain")

_SEQUENTIAL = (gluon.nn.Sequential, gluon.nn.HybridSequential)


def output_layer(net) -> Dict[str, gluon.Parameter]:
    """The parameters of `net`'s output layer, by place (as ``save_parameters`` names them:
    ``output.weight``, ``13.bias``); empty when `net` has none this rule can tell: neither
    an ``output`` block nor a sequential net ending in a layer with parameters."""
    block = getattr(net, "output", None)
    if not isinstance(block, gluon.Block) and isinstance(net, _SEQUENTIAL):
        block = next((net[i] for i in reversed(range(len(net)))
                      if net[i].collect_params()), None)
    if not isinstance(block, gluon.Block):
        return {}
    mine = {id(param) for param in block.collect_params().values()}
    return {place: param for place, param in params_by_place(net).items() if id(param) in mine}


def set_head_lr_mult(net, mult: float) -> None:
    """Make `net`'s output layer learn `mult` times faster (``lr_mult``, which Gluon's
    optimizers read at every update), as GluonCV's fine-tuning tutorial does."""
    if mult == 1:
        return
    head = output_layer(net)
    if not head:
        raise ConfigError("--head-lr-mult: this model has no output layer hvdtrain can find "
                          "(an 'output' block, or a sequential net ending in a layer with "
                          "parameters)")
    for param in head.values():
        param.lr_mult = mult
    logger.info("the output layer (%s) learns at %g x the learning rate", ", ".join(head), mult)


def apply_phase(net, trainer, cfg: TrainConfig, epoch: int) -> bool:
    """:func:`set_phase` for epoch `epoch` of the run `cfg` describes."""
    return set_phase(net, epoch, cfg.freeze_epochs, "add" if cfg.accumulate > 1 else "write",
                     trainer)


def set_phase(net, epoch: int, freeze_epochs: int, train_req: str = "write",
              trainer=None) -> bool:
    """Freeze `net`'s backbone for epoch `epoch` (counted from 0) if it is one of the first
    `freeze_epochs`, else let it train (``grad_req`` `train_req`: ``'add'`` under
    ``--accumulate``). Call it before each epoch; it changes nothing when the phase is the
    same as before, so a resumed or restarted run gets the phase of the epoch it is in.
    `trainer`, a :class:`~hvdtrain.store.buckets.BucketedTrainer` whose store is set up,
    plans its buckets for the new phase before the next backward pass. Returns whether
    anything changed."""
    if not freeze_epochs:
        return False
    frozen = epoch < freeze_epochs
    head = output_layer(net)
    if not head:
        raise ConfigError("--freeze-epochs: this model has no output layer hvdtrain can find "
                          "to train while the rest is frozen")
    changed = 0
    for place, param in params_by_place(net).items():
        if place in head:
            continue
        before = param.grad_req
        # Gluon keeps arrays that take no gradient (running statistics) at 'null'.
        param.grad_req = "null" if frozen else train_req
        changed += param.grad_req != before
    if not changed:
        return False
    if hasattr(trainer, "follow_gradients"):
        # Now, before the next backward pass binds the gradient arrays it is given: they
        # must be the new buckets' views, or every step copies them in.
        trainer.follow_gradients()
    if frozen:
        logger.info("epochs 1-%d: the backbone is frozen (%d arrays take no gradient and are "
                    "not exchanged); only the output layer trains", freeze_epochs, changed)
    else:
        logger.info("epoch %d: the backbone trains from here on (%d more arrays take "
                    "gradients)", epoch + 1, changed)
    return True
