"""hvdtrain with a fault injected into one worker (by the test, through its environment).

HVDTRAIN_FAULT=raise: the worker whose local rank is HVDTRAIN_FAULT_RANK raises in epoch 2.
HVDTRAIN_FAULT=nan:   the worker whose rank (HOROVOD_RANK) is HVDTRAIN_FAULT_RANK computes
                      a NaN loss at its 26th training step.
Usage: python failing_worker.py [hvdtrain flags...]
"""
import os

from mxnet import autograd, gluon

import hvdtrain.loop.run.fit
from hvdtrain import cli

FAULT = os.environ["HVDTRAIN_FAULT"]
RANK = os.environ["HVDTRAIN_FAULT_RANK"]
_train_epoch = hvdtrain.loop.run.fit.train_epoch  # fit() calls train_epoch by this module's name


def train_epoch(loop, loader, state):
    if loader.sampler.epoch == 1 and str(loop.dist.local_rank) == RANK:
        raise RuntimeError(f"injected failure on rank {loop.dist.rank}")
    return _train_epoch(loop, loader, state)


_loss_forward = gluon.loss.SoftmaxCrossEntropyLoss.forward
_training_steps = []


def poisoned_forward(self, pred, label):
    """NaN at one training step (NaN inputs would not do: ReLU maps them to 0)."""
    loss = _loss_forward(self, pred, label)
    if autograd.is_recording():
        _training_steps.append(1)
        if len(_training_steps) == 26 and os.environ.get("HOROVOD_RANK") == RANK:
            loss = loss * float("nan")
    return loss


if FAULT == "raise":
    hvdtrain.loop.run.fit.train_epoch = train_epoch
elif FAULT == "nan":
    gluon.loss.SoftmaxCrossEntropyLoss.forward = poisoned_forward
cli.run()
