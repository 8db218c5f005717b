"""A rank whose own step fails still steps with the others, and every rank stops with the
same line.

A batch processor's ``batch_samples`` or ``fit_batch`` (the forward and backward pass) can
raise on one rank alone: a batch of another shape, a sample the model cannot take, a bug
that only some data reaches. Raised there, the rank would leave between two collectives its
peers enter (the step's gradient and count exchange) and the others would end by the
launcher's kill or the stall timeout, printing that instead of the cause. Where the step's
counts are exchanged (:class:`~.counts.StepCounts`), :class:`StepVerdict` keeps the
error instead: the rank goes on as one whose batch held no usable sample (zero gradients,
:func:`~.batches.settle_idle_devices`), its verdict word rides the step's counts, and once
they are summed every rank that sees a failed step enters one agreed collective
(``train_step``, :func:`~hvdtrain.store.agree.agree`) and raises the same
:class:`~hvdtrain.store.agree.AgreedError` line: the failing rank's reason and its rank. No
rank applies that step. Where the counts are not exchanged (one worker, ``--elastic``,
``dist_async``) the error is raised at once, as it was.

An operator's error that MXNet's engine reports only at a later wait (not when the pass is
queued) and a failed collective (a lost peer) are not step verdicts: they are raised where
they come out (docs/reliability.md, "Agree, then act").
"""
from __future__ import annotations

from typing import Callable, Optional

import mxnet as mx

from ...store.agree import AgreedConfigError, AgreedError, agree, fault_point
from ...store.dist import DistContext


class StepVerdict:
    """This rank's verdict on its current step.

    Parameters
    ----------
    dist : DistContext
    shared : bool
        The step's counts are exchanged, so the verdict can ride them; else an error is
        raised where it happens.
    """

    def __init__(self, dist: DistContext, shared: bool):
        self.dist, self.shared = dist, shared
        self.error: Optional[BaseException] = None  # the step's first, on this rank

    @property
    def failed(self) -> bool:
        return self.error is not None

    def call(self, method: Callable, *args, pass_: bool = False):
        """``method(*args)``; where shared, an Exception it raises is kept as this rank's
        failure and None returned (nothing more runs in this step once one is kept).
        `pass_`: the step's forward and backward pass, where the test harness's fault
        switch (``HVDTRAIN_FAULT_AT=train_step:<rank>:<n>``) fails it."""
        if self.error is not None:
            return None
        try:
            if pass_:
                fault_point("train_step", self.dist.rank)
            return method(*args)
        except Exception as error:  # pylint: disable=broad-except
            if not self.shared:
                raise
            from ...runtime.elastic_run import is_collective_failure  # loads Horovod
            lost = isinstance(error, mx.base.MXNetError) and is_collective_failure(error)
            if lost or isinstance(error, (AgreedError, AgreedConfigError)):
                raise  # a peer gone (nothing left to agree with), or every rank's already
            self.error = error
            return None

    def settle(self, counts_failed: int) -> None:
        """After the step's counts are summed (`counts_failed`: the ranks whose step
        failed): where any failed, every rank raises the same agreed error; else the next
        step starts afresh."""
        if counts_failed or self.error is not None:
            error, self.error = self.error, None
            agree(self.dist, "train_step", _reason(error))


def _reason(error: Optional[BaseException]):
    """What travels as this rank's reason: an MXNetError as its one line (its C++
    traceback would fill the 512 bytes a reason has)."""
    if isinstance(error, mx.base.MXNetError):
        from ...runtime.elastic_run import error_summary  # loads Horovod
        return f"MXNetError: {error_summary(error)}"
    return error
