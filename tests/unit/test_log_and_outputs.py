import io
import json

import pytest

from helpers import run_command, tool

from hvdtrain.state.writes import atomic_write
from hvdtrain.report.log import MetricsWriter, setup_logging


def test_rank0_logs_info_other_ranks_only_warnings():
    for rank, expect_info in [(0, True), (3, False)]:
        stream = io.StringIO()
        logger = setup_logging(rank, stream)
        logger.info("hello")
        logger.warning("careful")
        text = stream.getvalue()
        assert ("hello" in text) == expect_info
        assert f"[rank {rank}] WARNING careful" in text
    setup_logging(0)


def test_metrics_writer_appends_and_is_silent_when_disabled(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "earlier"}\n')
    MetricsWriter(str(path)).write("epoch", epoch=0, test_acc=0.5)
    MetricsWriter(str(path), enabled=False).write("epoch", epoch=1)
    lines = [json.loads(l) for l in path.read_text().splitlines()]
    assert lines == [{"event": "earlier"}, {"event": "epoch", "epoch": 0, "test_acc": 0.5}]


def test_atomic_write_keeps_old_file_when_writer_fails(tmp_path):
    target = tmp_path / "model.params"
    target.write_text("old")

    def broken(path):
        with open(path, "w") as out:
            out.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):  # the writer's error reaches the caller
        atomic_write(str(target), broken)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.params"]


def test_an_error_line_is_one_write(monkeypatch):
    """mpirun tags each piece it reads from a rank: print()'s separate newline made the line
    run into the next rank's tag ("...no space left on device[1,1]<stderr>:")."""
    import io
    import sys

    from hvdtrain.report.log import error_line

    class Recording(io.StringIO):
        writes = []

        def write(self, text):
            self.writes.append(text)
            return super().write(text)

    monkeypatch.setattr(sys, "stderr", Recording())
    error_line("hvdtrain: error: cannot write x: no space left on device")
    assert Recording.writes == ["hvdtrain: error: cannot write x: no space left on device\n"]


def test_log_lines_go_to_the_current_stderr(monkeypatch):
    """The handler follows sys.stderr when it is replaced after set-up (a closed, replaced
    stream made the watchdog's thread fail to log and to exit)."""
    import io
    import sys

    from hvdtrain.report.log import setup_logging

    logger = setup_logging(rank=0)
    replaced = io.StringIO()
    monkeypatch.setattr(sys, "stderr", replaced)
    logger.warning("to the new stream")
    for handler in logger.handlers:
        handler.flush()
    assert "to the new stream" in replaced.getvalue()


def test_a_run_stopped_inside_an_epoch_reports_its_throughput(tmp_path):
    """--max-steps 20 stops inside the first epoch (128 steps of 64): the log, the run
    summary and the `stop` record give the steps, time and samples/s of what ran."""
    proc = run_command([tool("hvdtrain"), "--dataset", "synthetic", "--model", "mlp",
                        "--no-cuda", "--kvstore", "none", "--max-steps", "20",
                        "--log-interval", "0", "--output-dir", str(tmp_path)], timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert "no epoch completed" not in proc.stdout
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    [stop] = [r for r in records if r["event"] == "stop"]
    assert (stop["epoch"], stop["step"], stop["steps"]) == (0, 20, 20)
    # 20 steps of 64 samples on one worker: the rate times the time is that count.
    assert stop["samples_per_sec"] > 0 and stop["epoch_time"] > 0
    assert stop["samples_per_sec"] * stop["epoch_time"] == pytest.approx(20 * 64, rel=1e-6)
    rate = f"{stop['samples_per_sec']:.1f} samples/s"
    assert f"{rate} over 20 steps" in proc.stdout
    summary = proc.stdout[proc.stdout.index("run summary"):]
    assert "inside epoch 1 after 20 steps of it" in summary and rate in summary
