"""What a run does at the end of an epoch's steps: evaluate, save, stop. One small table.

Three facts decide it, the same on every rank (each comes from a collective or the step
count): a stop was asked during the epoch's steps (a signal, the launcher gone: every rank
learnt it with a step's vote), the epoch's batches all ran (or a batch handler ended the
epoch), and this epoch is the run's last (``epochs``, or ``max_steps`` reached).

======  ========  =====  =========  =======  ==========================================
asked   complete  last   evaluate   record   then
======  ========  =====  =========  =======  ==========================================
yes     no        any    no         stop     save it now, wait; every rank stops (75)
yes     yes       no     no         epoch    save it now, wait; every rank stops (75)
yes     yes       yes    yes        epoch    save it now; the run ends as it would have
no      no        yes    yes        stop     save it now (``max_steps`` inside an epoch)
no      yes       no     yes        epoch    save when due; next epoch (or a stop asked
                                             during the evaluation and writes, or a
                                             handler's end: then save now and stop)
no      yes       yes    yes        epoch    save it now; the run ends
======  ========  =====  =========  =======  ==========================================

An epoch that is not complete ends early only by a stop or ``max_steps``, which is its
last: "no, no, no" cannot happen. A stop asked mid-epoch grants no evaluation: the grace a
scheduler gives is for saving.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AfterSteps:
    """What the run does once an epoch's steps are done.

    Attributes
    ----------
    evaluate : bool
        Run the epoch's evaluation (and its ``epoch_end`` handlers).
    record : {'epoch', 'stop'}
        An ``epoch`` record (the epoch counts as done) or a ``stop`` record inside it.
    save_now : bool
        Save the checkpoint at once and wait for it; else only when the interval says so.
    preempt : bool
        Every rank then stops with :class:`~hvdtrain.loop.run.together.Preempted`.
    end : bool
        The run ends after this epoch's outputs.
    """

    evaluate: bool
    record: str
    save_now: bool
    preempt: bool
    end: bool


TABLE = {
    # (asked, complete, last)
    (True, False, False): AfterSteps(False, "stop", True, True, True),
    (True, False, True): AfterSteps(False, "stop", True, True, True),
    (True, True, False): AfterSteps(False, "epoch", True, True, True),
    (True, True, True): AfterSteps(True, "epoch", True, False, True),
    (False, False, True): AfterSteps(True, "stop", True, False, True),
    (False, True, False): AfterSteps(True, "epoch", False, False, False),
    (False, True, True): AfterSteps(True, "epoch", True, False, True),
}


def after_steps(asked: bool, complete: bool, last: bool) -> AfterSteps:
    """The table's row for an epoch whose steps are done."""
    try:
        return TABLE[bool(asked), bool(complete), bool(last)]
    except KeyError:
        raise AssertionError("an epoch ended early without a stop or max_steps") from None
