"""The stall watchdog: fires once after the timeout without progress anywhere, never while
this rank or (through the job's pulse) another one progresses or is busy."""
import logging
import threading
import time

import numpy as np

from hvdtrain.runtime.pulse import JobPulse
from hvdtrain.runtime.watchdog import GLOO_TIMEOUT_ENV, STALL_CHECK_ENV, Watchdog, horovod_stall_env


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_fires_after_timeout_naming_rank_and_last_step(caplog):
    clock, exits = FakeClock(), []
    dog = Watchdog(30, rank=1, clock=clock, exit=exits.append)
    dog.beat("training step 7 (epoch 1)")
    clock.now += 29
    assert not dog.check() and exits == []
    dog.beat("training step 8 (epoch 1)")
    clock.now += 29.9
    assert not dog.check()
    clock.now += 0.2
    with caplog.at_level(logging.ERROR, logger="hvdtrain"):
        assert dog.check()
    assert exits == [1]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "rank 1: no progress on any rank for 30 s" in record.getMessage()
    assert "last completed: training step 8 (epoch 1)" in record.getMessage()
    assert "never heard from the other ranks" in record.getMessage()


def test_a_busy_rank_or_news_of_progress_elsewhere_keeps_it_quiet(caplog):
    clock, exits = FakeClock(), []
    dog = Watchdog(30, rank=0, clock=clock, exit=exits.append)
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        with dog.busy("writing a checkpoint"):
            for _ in range(10):  # 300 s of writing: slow, not stalled
                clock.now += 30
                assert not dog.check()
    assert exits == [] and dog.busy_phase is None
    assert "rank 0 has been writing a checkpoint for 30 s" in caplog.text
    clock.now += 29
    dog.heard({0: "training, last progress 29 s before", 1: "writing a checkpoint (busy)"},
              progress=True)  # a peer is busy: progress
    clock.now += 29
    assert not dog.check()
    dog.heard({0: "training, last progress 58 s before", 1: "training, last progress 20 s before"},
              progress=False)  # every rank answers, none progresses
    clock.now += 1.5
    with caplog.at_level(logging.ERROR, logger="hvdtrain"):
        assert dog.check()
    assert exits == [1]
    assert "every rank answers (2 s ago), none progresses: rank 0: training, last progress " \
        "58 s before; rank 1: training, last progress 20 s before" in caplog.text


def test_when_the_pulse_too_goes_quiet_the_line_names_the_rank_that_stopped(caplog):
    clock, exits = FakeClock(), []
    dog = Watchdog(30, rank=0, clock=clock, exit=exits.append)
    dog.beat("training step 40 (epoch 2)")
    assert dog.phase() == "training"
    dog.heard({0: "training, last progress 0 s before", 1: "evaluation, last progress 1 s before"},
              progress=True)
    clock.now += 31  # rank 1 froze: no more rounds
    with caplog.at_level(logging.ERROR, logger="hvdtrain"):
        assert dog.check()
    assert "no rank has answered for 31 s: rank 1 stopped (frozen, dead or cut off); at the " \
        "last answer: rank 0: training, last progress 0 s before; rank 1: evaluation" \
        in caplog.text


def test_thread_exits_the_process_when_no_step_comes():
    exits = []
    with Watchdog(0.3, rank=0, exit=exits.append, interval=0.05):
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    assert exits == [1]


def test_beats_keep_it_quiet_and_zero_turns_it_off():
    exits = []
    # Beats 50 ms apart against a 5 s timeout: only a scheduler stall of 5 s could fire it.
    with Watchdog(5.0, rank=0, exit=exits.append, interval=0.05) as dog:
        for step in range(20):
            dog.beat(f"training step {step}")
            time.sleep(0.05)
    assert exits == []
    with Watchdog(0, exit=exits.append) as dog:
        assert dog._thread is None  # pylint: disable=protected-access
    assert exits == []


def test_horovod_stall_variables_follow_the_timeout_unless_set():
    # No stall shutdown: Horovod's would end a job whose rank 0 writes for longer.
    assert horovod_stall_env(600, {}) == {STALL_CHECK_ENV: "60", GLOO_TIMEOUT_ENV: "900"}
    assert horovod_stall_env(30, {}) == {STALL_CHECK_ENV: "15", GLOO_TIMEOUT_ENV: "45"}
    assert horovod_stall_env(1, {}) == {STALL_CHECK_ENV: "1", GLOO_TIMEOUT_ENV: "2"}
    assert horovod_stall_env(30, {STALL_CHECK_ENV: "5"}) == {GLOO_TIMEOUT_ENV: "45"}
    assert horovod_stall_env(0, {}) == {}
    # Elastic: the Gloo timeout finds a lost peer, so it stays Horovod's (or the user's).
    assert horovod_stall_env(600, {}, elastic=True) == {STALL_CHECK_ENV: "60"}


class InProcessSum:
    """A sum over `n` threads standing for ranks; a frozen rank never contributes."""

    def __init__(self, n):
        self.barrier = threading.Barrier(n)
        self.parts = {}
        self.frozen = set()

    def exchange_for(self, rank):
        def exchange(vector):
            while rank in self.frozen:
                time.sleep(0.05)
            self.parts[rank] = vector
            self.barrier.wait()
            total = np.sum(list(self.parts.values()), axis=0)
            self.barrier.wait()
            return total
        return exchange


def test_the_pulse_lets_a_waiting_rank_outlast_a_busy_one_but_not_a_frozen_one():
    """Rank 0 writes for 3x the timeout while rank 1 waits: neither fires. Then rank 0
    freezes: rank 1 fires; and a finished job ends both pulses."""
    collective, exits = InProcessSum(2), {0: [], 1: []}
    dogs = [Watchdog(1.5, rank=r, exit=exits[r].append, interval=0.05) for r in (0, 1)]
    pulses = [JobPulse(dogs[r], collective.exchange_for(r), r, 2, interval=0.05)
              for r in (0, 1)]
    try:
        for dog, pulse in zip(dogs, pulses):
            dog.pulse = pulse
            dog.start()
            pulse.start()
        with dogs[0].busy("writing a checkpoint"):
            time.sleep(4.5)
            states, _ = dogs[1]._heard  # pylint: disable=protected-access
            assert states[0] == "writing a checkpoint (busy)"
        assert exits == {0: [], 1: []}
        dogs[0].stop(finish_pulse=False)  # rank 0 freezes: no beats, no pulse
        collective.frozen.add(0)
        deadline = time.monotonic() + 30
        while not exits[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exits == {0: [], 1: [1]}
    finally:
        collective.barrier.abort()
        for dog in dogs:
            dog.stop(finish_pulse=False)


def test_pulses_end_together_once_every_rank_has_finished():
    collective = InProcessSum(2)
    dogs = [Watchdog(60, rank=r, exit=lambda code: None) for r in (0, 1)]
    pulses = [JobPulse(dogs[r], collective.exchange_for(r), r, 2, interval=0.05).start()
              for r in (0, 1)]
    assert pulses[0].finish(timeout=1) is False  # rank 1 still runs: rank 0 waits
    assert pulses[1].finish(timeout=30) and pulses[0].finish(timeout=30)


def test_every_training_step_and_evaluation_batch_beats_it(monkeypatch):
    from hvdtrain import job
    from hvdtrain.config import TrainConfig

    beats = []

    class Recording(Watchdog):
        def beat(self, step):
            beats.append(step)
            super().beat(step)

    monkeypatch.setattr(job, "Watchdog", Recording)
    run = job.train(TrainConfig(dataset="digits", no_cuda=True, kvstore="none", epochs=2,
                                batch_size=256, log_interval=0, progress=False,
                                stall_timeout=300))
    # digits: 1437 training samples (6 batches of 256), 360 test samples (2 batches).
    assert run.result["steps"] == 12
    training = [b for b in beats if b.startswith("training step")]
    evaluation = [b for b in beats if b.startswith("evaluation batch")]
    assert training[-1] == "training step 12 (epoch 2)" and len(training) == 12
    assert evaluation == ["evaluation batch 1 (epoch 1)", "evaluation batch 2 (epoch 1)",
                          "evaluation batch 1 (epoch 2)", "evaluation batch 2 (epoch 2)"]


def test_a_scripts_own_work_is_cut_short_only_when_the_pulse_goes_quiet(caplog):
    """hvdtrain.horovod: between its calls a script validates or saves for as long as it
    likes, without a warning; only a peer that stops answering the pulse ends it, and a
    lone rank (no pulse) never."""
    from hvdtrain.runtime.watchdog import SCRIPT_WORK  # pylint: disable=import-outside-toplevel
    clock, exits = FakeClock(), []
    alone = Watchdog(30, rank=0, clock=clock, exit=exits.append)
    alone.busy_phase = SCRIPT_WORK
    clock.now += 3600
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        assert not alone.check()
    dog = Watchdog(30, rank=0, clock=clock, exit=exits.append)
    dog.pulse = object()  # a pulse runs: its rounds are what dog.heard reports
    dog.busy_phase = SCRIPT_WORK
    for _ in range(20):  # ten minutes of validation, every rank answering
        clock.now += 30
        dog.heard({0: f"{SCRIPT_WORK} (busy)", 1: f"{SCRIPT_WORK} (busy)"}, progress=True)
        assert not dog.check()
    assert exits == [] and caplog.text == ""
    clock.now += 29
    assert not dog.check()
    clock.now += 2  # rank 1 stopped answering 31 s ago
    with caplog.at_level(logging.ERROR, logger="hvdtrain"):
        assert dog.check()
    assert exits == [1] and "rank 1 stopped (frozen, dead or cut off)" in caplog.text
    # After the script's work, inside a step: the usual rule (no progress anywhere).
    dog.busy_phase, exits[:] = None, []
    dog.heard({0: "training", 1: "training"}, progress=True)
    clock.now += 31
    assert dog.check() and exits == [1]


def test_a_pulse_round_that_fails_on_one_rank_is_made_again(caplog):
    """Rank 1's exchange fails once before it joins a round: it says so and joins that
    round again, so both pulses end together (issue 63). Before, rank 1's pulse left and
    rank 0's waited in the round for ever."""
    collective = InProcessSum(2)
    failures = []

    def failing_once(vector, exchange=collective.exchange_for(1)):
        if not failures:
            failures.append(1)
            raise RuntimeError("the pulse's sum failed here")
        return exchange(vector)

    dogs = [Watchdog(60, rank=r, exit=lambda code: None) for r in (0, 1)]
    pulses = [JobPulse(dogs[0], collective.exchange_for(0), 0, 2, interval=0.05),
              JobPulse(dogs[1], failing_once, 1, 2, interval=0.05)]
    try:
        with caplog.at_level(logging.WARNING, logger="hvdtrain"):
            for pulse in pulses:
                pulse.start()
            pulses[0].finish(timeout=0.5)  # rank 0 has finished: it waits for rank 1
            assert pulses[1].finish(timeout=30) and pulses[0].finish(timeout=30)
        said = [r.getMessage() for r in caplog.records if "pulse" in r.getMessage()]
        assert len(said) == 1 and "a round of the job's pulse failed here (the pulse's " \
            "sum failed here); making it again" in said[0], said
    finally:
        collective.barrier.abort()
