"""The stall watchdog: fires once after the timeout without a beat, never while beats come."""
import logging
import time

from hvdtrain.runtime.watchdog import (GLOO_TIMEOUT_ENV, STALL_CHECK_ENV, STALL_SHUTDOWN_ENV,
                               Watchdog, horovod_stall_env)


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
    assert "rank 1 waited 30 s with no step completed" in record.getMessage()
    assert "last completed: training step 8 (epoch 1)" in record.getMessage()


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
    assert horovod_stall_env(600, {}) == {STALL_CHECK_ENV: "60", STALL_SHUTDOWN_ENV: "900",
                                          GLOO_TIMEOUT_ENV: "900"}
    assert horovod_stall_env(30, {}) == {STALL_CHECK_ENV: "15", STALL_SHUTDOWN_ENV: "45",
                                         GLOO_TIMEOUT_ENV: "45"}
    assert horovod_stall_env(1, {}) == {STALL_CHECK_ENV: "1", STALL_SHUTDOWN_ENV: "2",
                                        GLOO_TIMEOUT_ENV: "2"}
    assert horovod_stall_env(30, {STALL_CHECK_ENV: "5", GLOO_TIMEOUT_ENV: "9"}) == \
        {STALL_SHUTDOWN_ENV: "45"}
    assert horovod_stall_env(0, {}) == {}


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
