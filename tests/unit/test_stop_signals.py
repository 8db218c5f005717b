"""Preemption, piece by piece: --checkpoint-every's forms, the stop signals, the decisions of a
step boundary, and a rank whose launcher is gone. (Whole jobs: tests/dist/test_preemption.py.)
"""
import os
import signal
import subprocess
import sys
import time

import mxnet as mx
import pytest
from mxnet import gluon

from helpers import REPO, main_in_process
from hvdtrain.cli import parse_config
from hvdtrain.estimator.errors import in_keywords
from hvdtrain.loop.run.boundary import Boundary
from hvdtrain.loop.run.together import Preempted, StoppedTogether
from hvdtrain.options import interval_of
from hvdtrain.runtime.lifeline import EXIT_LAUNCHER_GONE, Ancestor, LauncherWatch
from hvdtrain.runtime.stop_signals import REPEAT_WINDOW, StopSignals
from hvdtrain.state.train_state import TrainState
from hvdtrain.state.writes import OutputError
from hvdtrain.store.dist import DistContext


@pytest.mark.parametrize("text,meaning", [
    ("1", ("epochs", 1)), ("3", ("epochs", 3)), ("2epochs", ("epochs", 2)),
    ("500steps", ("steps", 500)), ("1step", ("steps", 1)), ("90s", ("seconds", 90.0)),
    ("30m", ("seconds", 1800.0)), ("2h", ("seconds", 7200.0)), ("0.5h", ("seconds", 1800.0))])
def test_checkpoint_every_takes_epochs_steps_and_times(text, meaning):
    cfg = parse_config(["--dataset", "digits", "--checkpoint-every", text])
    assert interval_of(cfg.checkpoint_every) == meaning
    # The epoch form keeps the number it always had (checkpoints compare configurations).
    assert cfg.checkpoint_every == (meaning[1] if meaning[0] == "epochs" else cfg.checkpoint_every)


@pytest.mark.parametrize("text", ["0", "-1", "0s", "1.5", "1.5steps", "10d", "often", "1e3"])
def test_checkpoint_every_refuses_what_is_not_an_interval(text, capfd):
    code, lines = main_in_process(["--dataset", "digits", f"--checkpoint-every={text}"], capfd)
    assert code == 2 and len(lines) == 1, lines
    assert "--checkpoint-every: expected epochs (2), steps (500steps) or a time" in lines[0]


# --- the stop signals -----------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_first_signal_is_noted_a_repeat_ignored_and_a_second_one_ends_the_process():
    clock, exits = Clock(), []
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(clock=clock, exit=exits.append) as signals:
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while signals.received is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert signals.received == "SIGUSR1" and exits == []
        signals.notice(signal.SIGINT)  # Ctrl-C reaching a rank twice: one request
        assert exits == []
        clock.now += REPEAT_WINDOW
        signals.notice(signal.SIGTERM)
        assert exits == [128 + signal.SIGTERM]
        assert signals.received == "SIGUSR1"
    assert signal.getsignal(signal.SIGTERM) is before  # put back after the run


SIGNALLED_CHILD = """
import sys, threading
sys.path.insert(0, {repo!r})
from hvdtrain.runtime.stop_signals import StopSignals
with StopSignals():
    print("ready", flush=True)
    threading.Event().wait()  # the main thread blocked in C, as inside MXNet or Horovod
"""


def test_a_second_signal_ends_a_process_whose_main_thread_is_blocked():
    """The reading thread acts while the main thread waits in C, where a Python-level
    handler would wait too; the first TERM does not end the process (it would without
    StopSignals), the second does, with 128 + 15."""
    child = subprocess.Popen([sys.executable, "-c", SIGNALLED_CHILD.format(repo=REPO)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        time.sleep(REPEAT_WINDOW + 0.5)
        assert child.poll() is None, "the first signal ended the process"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 128 + signal.SIGTERM
        err = child.stderr.read()
        assert "got SIGTERM: every rank stops at the next step boundary" in err
        assert "got SIGTERM while stopping for SIGTERM: exiting at once" in err
    finally:
        child.kill()


# --- the decisions of a step boundary ------------------------------------------------------

class FakeCheckpointer:
    """Records the saves asked of it; `writing` and `failure` play rank 0's background write."""

    def __init__(self):
        self.saves, self.writing, self.failure = [], False, None

    def gather(self, trainer, due=True):  # every rank, before a save (PowerSGD's state)
        pass

    def save(self, net, trainer, state, replace=None, files=None):
        self.saves.append(state.step)
        return f"ckpt-{state.step}"

    @property
    def failed(self):
        return self.failure is not None and not self.writing

    def write_status(self):
        return self.failed, self.writing

    def wait(self):
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure


class Asked:
    received = None


def boundary(every, clock=None, checkpointer=None, signals=None):
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize()
    return Boundary(net, None, DistContext(), checkpointer or FakeCheckpointer(), every,
                    signals, clock=clock or Clock())


def test_a_step_interval_saves_at_its_steps_and_defers_while_a_write_runs():
    b = boundary("3steps")
    saver = b.checkpointer
    for step in range(1, 7):
        b.after_step(b.vote(), TrainState(step=step, epoch_samples=step), last_of_epoch=False)
    assert saver.saves == [3, 6]
    saver.writing = True  # rank 0's previous write still runs: the save waits for its end
    b.after_step(b.vote(), TrainState(step=9), last_of_epoch=False)
    assert saver.saves == [3, 6] and b.pending
    saver.writing = False
    b.after_step(b.vote(), TrainState(step=10), last_of_epoch=False)
    assert saver.saves == [3, 6, 10] and not b.pending


def test_a_save_due_at_an_epochs_last_step_is_left_to_the_epochs_end():
    b = boundary("2steps")
    b.after_step(b.vote(), TrainState(step=2), last_of_epoch=True)
    assert b.checkpointer.saves == [] and b.pending  # fit saves the epoch's checkpoint


def test_a_time_interval_follows_rank_0s_clock():
    clock = Clock()
    b = boundary("90s", clock=clock)
    assert b.vote() == (0, 0, 0, 0, 0)
    clock.now += 90
    assert b.vote() == (0, 1, 0, 0, 0)
    b.after_step(b.vote(), TrainState(step=7), last_of_epoch=False)
    assert b.checkpointer.saves == [7] and b.vote() == (0, 0, 0, 0, 0)  # a new interval starts
    # Another rank's clock says nothing: only rank 0 votes for a timed save.
    other = Boundary(None, None, DistContext(rank=1, num_workers=2), None, "90s", clock=clock)
    clock.now += 1000
    assert other.vote() == (0, 0, 0, 0, 0)


def test_a_stop_request_stops_without_a_save_of_its_own():
    signals = Asked()
    b = boundary("1", signals=signals)
    assert b.vote()[0] == 0
    signals.received = "SIGTERM"
    assert b.vote()[0] == 1
    b.after_step((2, 0, 0, 0), TrainState(step=5), last_of_epoch=False)  # 2 ranks asked
    assert b.stopping == 2 and b.checkpointer.saves == []  # fit saves the stop's checkpoint
    line = b.preempted(TrainState(epoch=1, step=5, epoch_samples=70), "DIR/epoch-0001-step-0000005",
                       70).line
    assert line == ("hvdtrain: stopped at step 5, 70 samples into epoch 2 (SIGTERM); checkpoint "
                    "saved: DIR/epoch-0001-step-0000005; exit 75: run it again with --resume "
                    "auto to continue")
    # A rank that was not asked itself says why all stopped, and how many asked.
    other = Boundary(None, None, DistContext(rank=0, num_workers=4, store=None), None, "1")
    other.stopping = 1
    assert other.why() == "another rank's request; 1 of 4 ranks asked"
    assert isinstance(b.preempted(TrainState(), None, 0), Preempted)
    assert Preempted.status == 75
    # Nothing saved (no --output-dir): no advice to --resume auto, which needs a folder.
    unsaved = b.preempted(TrainState(epoch=0, step=5, epoch_samples=70), None, 70).line
    assert unsaved == ("hvdtrain: stopped at step 5, 70 samples into epoch 1 (SIGTERM); nothing "
                       "saved (no --output-dir); exit 75: a run again starts over; give "
                       "--output-dir to make a stop resumable"), unsaved
    # An Estimator program hears the same lines in its keywords (it prints in_keywords(line)).
    assert in_keywords(line).endswith("exit 75: run it again with resume='auto' to continue")
    assert "nothing saved (no output_dir)" in in_keywords(unsaved)
    assert "give output_dir to make" in in_keywords(unsaved)


def test_a_signal_after_the_deciding_vote_changes_neither_the_record_nor_the_line():
    """A launcher's signal reaches the ranks a moment apart: rank 1's request decided the stop
    before rank 0 noticed its own. The record (written first) and the line (printed after
    the save) both say what rank 0 voted, so they agree with each other and with the count
    (seen once under horovodrun --gloo: the line said SIGTERM, the record another rank's
    request)."""
    signals = Asked()
    rank0 = Boundary(None, None, DistContext(rank=0, num_workers=2, store=None), None, "1",
                     signals)
    assert rank0.vote()[0] == 0
    rank0.after_step((1, 0, 0, 0), TrainState(step=5), last_of_epoch=False)
    record_says = rank0.why()
    signals.received = "SIGTERM"
    line = rank0.preempted(TrainState(epoch=1, step=5, epoch_samples=70), "D/c", 70).line
    assert record_says == rank0.why() == "another rank's request; 1 of 2 ranks asked"
    assert "(another rank's request; 1 of 2 ranks asked)" in line, line


def test_a_failed_background_write_stops_every_rank_with_its_line():
    b = boundary("1steps")
    b.checkpointer.failure = OutputError("cannot write D/checkpoints/.tmp-x: no space left on "
                                         "device")
    votes = b.vote()
    assert votes == (0, 0, 1, 0, 0)
    with pytest.raises(StoppedTogether) as stopped:
        b.after_step(votes, TrainState(step=4), last_of_epoch=False)
    assert stopped.value.line == ("hvdtrain: error: cannot write D/checkpoints/.tmp-x: no space "
                                  "left on device")
    # Another rank learns of it through the summed vote and names rank 0 and the step.
    other = Boundary(None, None, DistContext(rank=1, num_workers=2), None, "1")
    with pytest.raises(StoppedTogether) as peer:
        other.after_step((0, 0, 1, 0), TrainState(step=4), last_of_epoch=False)
    assert peer.value.line.endswith("rank 0 could not write its outputs (its own line says "
                                    "why); every rank stopped at step 4")


def test_the_vote_reads_a_write_that_ends_failing_as_busy_then_failed():
    """A real Checkpointer whose write thread fails just as the vote reads it: the first read
    of its liveness says running, the truth comes after. The vote reads it once: busy (no
    save is started into the failure), then failed at the next step (before: "failed?" and
    "busy?" read apart saw neither, and rank 0 started the next save alone)."""
    from hvdtrain.state.checkpoint import Checkpointer

    class EndingWrite:
        failure = OutputError("cannot write X: no space left on device")
        reads = 0

        @property
        def running(self):
            self.reads += 1
            return self.reads == 1

    saver = Checkpointer("unused", enabled=True)
    saver._write = EndingWrite()  # pylint: disable=protected-access
    b = boundary("1steps", checkpointer=saver)
    assert b.vote() == (0, 0, 0, 1, 0)
    assert b.vote() == (0, 0, 1, 0, 0)


def test_the_signal_thread_owns_its_descriptor(monkeypatch):
    """The end of a run never closes the descriptor the signal thread reads while that
    thread still runs (busy past the wait, e.g. logging a signal's line): its number could
    be reused by then, and the thread would read someone else's file. The thread closes it
    when it ends."""
    import threading
    from hvdtrain.runtime import stop_signals
    monkeypatch.setattr(stop_signals, "JOIN_WAIT", 0.2, raising=False)
    busy, leave = threading.Event(), threading.Event()

    def slow_notice(signum):
        busy.set()
        leave.wait(10)
    signals = StopSignals()
    monkeypatch.setattr(signals, "notice", slow_notice)
    with signals:
        read_fd = signals._pipe[0]  # pylint: disable=protected-access
        thread = signals._thread  # pylint: disable=protected-access
        os.kill(os.getpid(), signal.SIGTERM)
        assert busy.wait(10)
    assert thread.is_alive()
    os.fstat(read_fd)  # still open: the thread may read it yet
    leave.set()
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(OSError):
        os.fstat(read_fd)


# --- a rank whose launcher is gone --------------------------------------------------------

def test_a_rank_whose_launcher_is_gone_asks_for_a_stop_then_exits_after_the_grace(tmp_path):
    clock, exits, asked = Clock(), [], []
    watch = LauncherWatch([Ancestor(9, "1009", "sh -c mpirun")], describe=lambda: "rank 1",
                          proc=str(tmp_path), exit=exits.append, grace=60, clock=clock,
                          on_gone=lambda reason: asked.append(reason) or True)
    assert not watch.check()  # pid 9 has no /proc entry: gone
    assert asked == ["its launcher sh -c mpirun (pid 9) is gone"] and exits == []
    clock.now += 59
    assert not watch.check() and exits == []
    clock.now += 1
    assert watch.check() and exits == [EXIT_LAUNCHER_GONE] and len(asked) == 1


def test_without_a_stop_to_ask_for_a_rank_exits_at_once(tmp_path):
    exits = []
    watch = LauncherWatch([Ancestor(9, "1009", "mpirun")], proc=str(tmp_path),
                          exit=exits.append, on_gone=lambda reason: False)
    assert watch.check() and exits == [EXIT_LAUNCHER_GONE]
