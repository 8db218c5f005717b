"""What every rank decides at a step boundary besides the update: save a checkpoint now,
stop now, or stop because rank 0's background write failed.

Each rank casts a vote of four numbers with the sample counts it sums over the workers every
step (:class:`~hvdtrain.loop.engine.counts.StepCounts`: one small allreduce, issued before the
step's last forward pass so it completes under the compute). The numbers are

- ``stop``: this rank was asked to stop (a signal, its launcher gone; runtime/stop_signals.py);
- ``save``: rank 0's clock says a timed checkpoint is due (``--checkpoint-every 30m``);
- ``failed``: rank 0's background checkpoint write failed (a full disk);
- ``busy``: rank 0's background write is still running;
- ``end``: a batch handler of this rank asked to end the epoch after the step before (an
  Estimator handler's ``batch_end`` returned True): every rank ends it at this step, which
  is not applied.

Summed, they are the same on every rank, so every rank takes the same decision at the same
step, with no round trip of its own. Step intervals (``500steps``) need no vote: the step
count is the same everywhere. A save is started only at a boundary where the vote says rank
0's previous write is done (one write at a time, never a stall waiting for it mid-epoch), so
a due save may come a few steps late; a save due at an epoch's last step is the epoch's
checkpoint, taken after its evaluation (:attr:`Boundary.pending`).

The vote is sampled when the step's counts are submitted, so a signal that lands during a
step is acted on at the end of the next one: a stop costs at most the rest of the step in
flight, one more step, and the save. Under ``dist_async`` there is no collective: each worker
acts on its own vote (rank 0 saves on its own signal or clock; another worker stops alone).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional, Sequence, Tuple

import mxnet as mx

from ...options import interval_of
from ...state.background import HostCopy
from ...state.writes import OutputError
from ...store.dist import DistContext
from ...store.gluon_internals import host_arrays, optimizer_states_later, params_by_place
from ..engine.replicas import averaged_running_stats
from .together import Preempted, leave_together, stopped_by_failed_write, write_together

logger = logging.getLogger("hvdtrain")

VOTES = ("stop", "save", "failed", "busy", "end")


def host_copy(net, trainer, with_states: bool, replace: Optional[dict] = None,
              states: Optional[Callable[[], bytes]] = None) -> HostCopy:
    """`net`'s arrays (with `replace`'s instead where it names one) and `trainer`'s optimizer
    state, copied to host memory: all a checkpoint holds, taken while training waits (memory
    copies only: the optimizer state is serialised by the write). `states`: the optimizer
    state gathered already, on every rank (a sharded trainer's,
    :func:`~hvdtrain.state.checkpoint.gathered_states`)."""
    # Writes MXNet's engine does not track (BatchNorm's running statistics under static
    # allocation: loop/engine/replicas.py) must be done before the copy reads them.
    mx.nd.waitall()
    arrays = host_arrays(net)
    for name, value in (replace or {}).items():
        arrays[name] = value.copy()
    for value in arrays.values():
        value.wait_to_read()
    if with_states and states is None:
        states = optimizer_states_later(trainer)
    return HostCopy(arrays, states if with_states else None)


class Boundary:
    """The decisions of every step boundary of one run.

    Parameters
    ----------
    net, trainer, dist
        What is saved and who takes part.
    checkpointer : Checkpointer or None
        Rank 0's (a no-op elsewhere); None: nothing is saved.
    every : int or str
        ``--checkpoint-every``: epochs (the epoch ends decide: fit), steps, or a time.
    signals : StopSignals or None
        This rank's note of a stop request; None: none can come.
    guard : FiniteGuard
        Checked before any save: no checkpoint holds non-finite parameters.
    clock : callable
        Rank 0's clock for timed checkpoints.
    ema : WeightAverage or None
        ``--ema``'s average, saved with each checkpoint.
    before_save : callable or None
        ``before_save(state)`` on every rank before a checkpoint inside an epoch (an
        elastic run's commit to memory: its saves are written before training goes on).

    Attributes
    ----------
    stopping : int
        How many ranks asked to stop, once they did (0 before): the run stops at this
        boundary.
    pending : bool
        A step or time checkpoint is due and not yet started (the same on every rank).
    """

    def __init__(self, net, trainer, dist: DistContext, checkpointer, every, signals=None,
                 guard=None, clock: Callable[[], float] = time.monotonic, ema=None,
                 before_save: Optional[Callable] = None, replicas=None):
        self.net, self.trainer, self.dist = net, trainer, dist
        self.before_save = before_save
        self.replicas = replicas  # the run's ReplicaCheck: every save compares the ranks
        self.checkpointer = checkpointer
        self.kind, self.amount = interval_of(every)
        self.signals = signals
        self.guard = guard
        self.ema = ema
        self._clock = clock
        self._last_save = clock()
        self.stopping = 0
        self.pending = False
        # This rank's reason at its last vote: the stop's record and its line both say it, so
        # they agree with the count even when this rank's own signal comes after the vote
        # that decided (a launcher's signal reaches the ranks a moment apart).
        self._voted_reason: Optional[str] = None

    @property
    def reason(self) -> Optional[str]:
        """Why this rank asked to stop (``"SIGTERM"``), or None."""
        return None if self.signals is None else self.signals.received

    def why(self) -> str:
        """Why the run stops, as this rank voted: its own reason, or another rank's request;
        with how many ranks asked. A signal that arrives after the deciding vote changes
        nothing here."""
        why = self._voted_reason or "another rank's request"
        if self.dist.num_workers > 1 and self.dist.synchronous:
            why += f"; {self.stopping} of {self.dist.num_workers} ranks asked"
        return why

    def vote(self, end: bool = False) -> Tuple[int, int, int, int, int]:
        """This rank's vote, in the order of :data:`VOTES`; `end`: a batch handler asked to
        end the epoch."""
        saver = self.checkpointer if self.dist.is_root else None
        due = self.kind == "seconds" and self.dist.is_root and \
            self._clock() - self._last_save >= self.amount
        failed, busy = saver.write_status() if saver is not None else (False, False)
        self._voted_reason = self.reason
        return int(self._voted_reason is not None), int(due), int(failed), int(busy), int(end)

    @staticmethod
    def ends_epoch(votes: Sequence[int]) -> bool:
        """Whether the step's summed `votes` end the epoch before the step is applied."""
        return len(votes) > 4 and int(votes[4]) > 0

    def after_step(self, votes: Sequence[int], state, last_of_epoch: bool) -> None:
        """Act on the step's summed `votes` (every rank alike), `state` past the step."""
        stop, save, failed, busy = (int(v) for v in votes[:4])
        if failed:
            raise self._write_failed(state.step)
        if stop:
            self.stopping = stop  # the stop saves (fit)
            return
        if save or (self.kind == "steps" and state.step % self.amount == 0):
            self.pending = True
        if self.pending and not busy and not last_of_epoch:
            self.save_inside_epoch(state)

    def save_inside_epoch(self, state) -> None:
        """Every rank: a checkpoint of this position inside the epoch, written by rank 0 in
        the background. The running statistics it saves are averaged over the ranks, as an
        epoch's end averages them, without changing the ones each rank trains on: a run that
        saves every N steps trains exactly as one that does not. So are the running
        statistics of ``--ema``'s average."""
        if self.guard is not None:
            self.guard.check(state.step, force=True)
        if self.before_save is not None:
            self.before_save(state)
        if self.replicas is not None:  # each rank's running statistics are its own here
            self.replicas.verify(f"the checkpoint at step {state.step}", statistics=False,
                                 state=state)
        statistics = self.ema.statistics() if self.ema is not None else []
        averages, ema_statistics = averaged_running_stats(self.net, self.dist, statistics)
        if self.checkpointer is not None:
            self.checkpointer.gather(self.trainer)  # PowerSGD's errors: summed over ranks
            names = {id(param): name for name, param in params_by_place(self.net).items()}
            files = None if self.ema is None else self.ema.files(ema_statistics)
            # Rank 0's save can still fail (the write before it, waited for; a synchronous
            # write under --elastic): every rank learns of it here and all stop together.
            write_together(self.dist, lambda: self.checkpointer.save(
                self.net, self.trainer, state,
                {names[id(param)]: value for param, value in averages}, files),
                f"step {state.step}")
        self.saved()

    def saved(self) -> None:
        """A checkpoint was just started (here or at an epoch's end): the next is due a whole
        interval from now."""
        self.pending = False
        self._last_save = self._clock()

    def stop_agreed(self, end: bool = False) -> Tuple[int, bool]:
        """Every rank, at an epoch's end: how many ranks asked to stop during its last step,
        its evaluation or its writes, and whether any rank's handlers asked to end training
        (`end`, this rank's: an ``epoch_end`` handler returned True). One small collective
        per epoch, none per step."""
        self._voted_reason = self.reason
        votes = [int(self._voted_reason is not None), int(bool(end))]
        if self.dist.num_workers > 1 and self.dist.synchronous:
            votes = [int(v) for v in self.dist.agree("stop_vote", payload=votes)]
        self.stopping = max(self.stopping, votes[0])
        return self.stopping, votes[1] > 0

    def preempted(self, state, path: Optional[str], samples_in_epoch: int) -> Preempted:
        """What every rank raises once the stop's checkpoint (`path`, None when nothing is
        saved) is written: rank 0 says it in one line; the status tells a wrapper to
        requeue."""
        line = ""
        if self.dist.is_root:
            where = (f"{samples_in_epoch} samples into epoch {state.epoch + 1}"
                     if samples_in_epoch else f"after epoch {state.epoch}")
            if path:
                outcome = (f"checkpoint saved: {path}; exit {Preempted.status}: run it again "
                           f"with --resume auto to continue")
            else:  # --resume auto needs --output-dir: there is nothing to continue from
                outcome = (f"nothing saved (no --output-dir); exit {Preempted.status}: a run "
                           f"again starts over; give --output-dir to make a stop resumable")
            line = f"hvdtrain: stopped at step {state.step}, {where} ({self.why()}); {outcome}"
        return Preempted(line, lambda: leave_together(self.dist))

    def _write_failed(self, step: int):
        """The error every rank raises when rank 0's background write failed."""
        failed = None
        if self.dist.is_root and self.checkpointer is not None:
            try:
                self.checkpointer.wait()
            except OutputError as err:
                failed = err
        return stopped_by_failed_write(self.dist, failed, [0], f"step {step}")
