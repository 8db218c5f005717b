"""What users see: progress bar, plots, TensorBoard, run summary, help."""
import json
import re
import os
import pty
import select
import struct
import subprocess

import pytest

from helpers import main_in_process, run_command, tool
from hvdtrain.report.plot import load_runs, main as plot_main, plot
from hvdtrain.report.progress import summary_lines

QUICK = ["--dataset", "digits", "--no-cuda", "--kvstore", "none", "--epochs", "1",
         "--batch-size", "32"]


def run_in_pty(cmd, timeout=120):
    """Run `cmd` with stdout and stderr on a pseudo-terminal; return what it printed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            pytest.fail("no output from the pseudo-terminal")
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=timeout)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_and_not_when_piped():
    code, shown = run_in_pty([tool("hvdtrain")] + QUICK)
    assert code == 0, shown
    assert "epoch 1:" in shown and "step/s" in shown and "loss=" in shown
    piped = run_command([tool("hvdtrain")] + QUICK + ["--log-interval", "10"], timeout=120)
    assert piped.returncode == 0
    assert "step/s" not in piped.stdout and "step 10/45" in piped.stdout
    forced = run_command([tool("hvdtrain")] + QUICK + ["--progress"], timeout=120)
    assert "step/s" in forced.stdout
    code, shown = run_in_pty([tool("hvdtrain")] + QUICK + ["--no-progress"])
    assert code == 0 and "step/s" not in shown


def _metrics_with_two_runs(path):
    lines = []
    for kvstore, workers, accs in (("horovod", 2, [0.5, 0.8, 0.9]), ("dist_sync", 1, [0.4, 0.7])):
        lines.append({"event": "start", "num_workers": workers, "start_epoch": 0,
                      "config": {"dataset": "digits", "kvstore": kvstore, "batch_size": 64,
                                 "lr": 0.05}})
        for epoch, acc in enumerate(accs):
            lines.append({"event": "epoch", "epoch": epoch, "step": 10 * epoch,
                          "train_loss": 1 - acc, "test_loss": 1.1 - acc, "train_acc": acc,
                          "test_acc": acc - 0.05, "samples_per_sec": 1000.0 * workers})
        lines.append({"event": "end", "test_acc": accs[-1]})
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))


def _png_size(path):
    with open(path, "rb") as src:
        head = src.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_plot_two_runs(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _metrics_with_two_runs(metrics)
    runs = load_runs(str(metrics))
    assert [len(r["epochs"]) for r in runs] == [3, 2]
    assert "dist_sync" in runs[1]["label"] and "2 x batch 64" in runs[0]["label"]
    out = tmp_path / "curves.png"
    proc = run_command([tool("hvdtrain-plot"), str(metrics), "-o", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert _png_size(out) == (1500, 450) and out.stat().st_size > 20000


def test_resumed_run_continues_its_curve(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    records = [{"event": "start", "start_epoch": 0, "config": {}},
               {"event": "epoch", "epoch": 0, "train_loss": 1, "test_acc": 0.5,
                "samples_per_sec": 1},
               {"event": "start", "start_epoch": 1, "config": {}},
               {"event": "epoch", "epoch": 1, "train_loss": 0.5, "test_acc": 0.7,
                "samples_per_sec": 1}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [len(r["epochs"]) for r in load_runs(str(metrics))] == [2]
    plot(load_runs(str(metrics)), str(tmp_path / "one.png"))


def test_plot_bad_input(tmp_path, capfd, monkeypatch):
    """In this process (plot's main): test_plot_refusal_is_one_line_from_the_whole_process
    runs a real one."""
    monkeypatch.chdir(tmp_path)  # where the default curves.png would go
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    for path, needle in ((bad, "not a metrics.jsonl"), (tmp_path / "none", "cannot read")):
        code, lines = main_in_process([str(path)], capfd, main=plot_main)
        assert code == 2 and any(needle in l for l in lines), lines


GOOD_EPOCH = {"event": "epoch", "epoch": 0, "train_loss": 1.0, "test_acc": 0.5,
              "samples_per_sec": 10.0}


@pytest.mark.parametrize("content,extra,needle", [
    ("[1,2,3]\n", [], "line 1 is a JSON list, not a record object"),
    ('{"event":"epoch"}\n', [], "line 1: epoch record needs a number in 'epoch', got null"),
    (json.dumps(dict(GOOD_EPOCH, epoch="one")) + "\n", [], "needs a number in 'epoch', got \"one\""),
    (json.dumps(dict(GOOD_EPOCH, train_loss=[1])) + "\n", [], "in 'train_loss', got [1]"),
    (json.dumps(dict(GOOD_EPOCH, samples_per_sec="fast")) + "\n", [], "in 'samples_per_sec'"),
    (json.dumps(dict(GOOD_EPOCH, test_acc=True)) + "\n", [], "in 'test_acc', got true"),
    ('"just a string"\n', [], "is a JSON str, not a record object"),
    (json.dumps(GOOD_EPOCH) + "\n", ["-o", "/nonexistent/dir/c.png"],
     "folder /nonexistent/dir does not exist"),
    (json.dumps(GOOD_EPOCH) + "\n", ["-o", "x.xyz"], "cannot write .xyz; use one of"),
    (json.dumps(GOOD_EPOCH) + "\n", ["--dpi", "0"], "--dpi must be in [1, 1000], got 0"),
    (json.dumps(GOOD_EPOCH) + "\n", ["--dpi", "-5"], "--dpi must be in [1, 1000]"),
])
def test_plot_bad_input_is_one_line(tmp_path, content, extra, needle, capfd,
                                    monkeypatch):
    """In this process (plot's main), in `tmp_path` as the real one ran: what a whole
    process adds around the line is test_plot_refusal_is_one_line_from_the_whole_process's."""
    monkeypatch.chdir(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(content)
    code, lines = main_in_process([str(metrics), *extra], capfd, main=plot_main)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain-plot: error: ") and needle in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]


def test_plot_refusal_is_one_line_from_the_whole_process(tmp_path):
    """A real hvdtrain-plot process: its one line and nothing else (no warning from a
    library, no traceback at exit)."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps(dict(GOOD_EPOCH, epoch="one")) + "\n")
    proc = run_command([tool("hvdtrain-plot"), str(metrics)], timeout=120, cwd=str(tmp_path))
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout[-2000:]
    assert lines[0].startswith("hvdtrain-plot: error: ") and \
        "needs a number in 'epoch', got \"one\"" in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]


def _tensorboard_scalars(folder):
    from tensorboardX.proto import event_pb2
    scalars = {}
    for name in os.listdir(folder):
        data = open(os.path.join(folder, name), "rb").read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_tensorboard_scalars_match_the_metrics_file(tmp_path):
    proc = run_command([tool("hvdtrain")] + QUICK + ["--epochs", "2", "--output-dir",
                       str(tmp_path), "--tensorboard", str(tmp_path / "tb")], timeout=120)
    assert proc.returncode == 0, proc.stdout
    scalars = _tensorboard_scalars(tmp_path / "tb")
    epochs = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if '"epoch"' in l and json.loads(l)["event"] == "epoch"]
    assert sorted(scalars) == ["test/acc", "test/loss", "test/top5", "train/acc",
                               "train/loss", "train/lr", "train/samples_per_sec"]
    for record in epochs:
        assert scalars["test/acc"][record["epoch"]] == pytest.approx(record["test_acc"])
        assert scalars["train/loss"][record["epoch"]] == pytest.approx(record["train_loss"])


def test_run_summary():
    epochs = [{"epoch": 0, "step": 10, "test_acc": 0.9, "samples_per_sec": 100.0,
               "epoch_time": 3.0},
              {"epoch": 1, "step": 20, "test_acc": 0.95, "samples_per_sec": 300.0,
               "epoch_time": 1.0},
              {"epoch": 2, "step": 30, "test_acc": 0.93, "samples_per_sec": 200.0,
               "epoch_time": 1.5}]
    text = "\n".join(summary_lines(epochs, 12.34, 2, 1, "horovod", ["runs/x/metrics.jsonl"]))
    assert "final 0.9300, best 0.9500 (epoch 2)" in text
    # 300 + 300 + 300 samples in 5.5 s: the rate over the time trained, not a mean of rates.
    assert "163.6 samples/s" in text and "2 x 1 device(s), horovod" in text
    assert "12.3 s" in text and "outputs        runs/x/metrics.jsonl" in text
    assert "none (no --output-dir)" in "\n".join(summary_lines(epochs, 1, 1, 1, "horovod", []))
    assert "EMA" not in text
    for record, ema in zip(epochs, (0.91, 0.96, 0.94)):
        record["ema_test_acc"] = ema
    text = "\n".join(summary_lines(epochs, 12.34, 2, 1, "horovod", []))
    assert "EMA test accuracy  final 0.9400, best 0.9600 (epoch 2)" in text
    stopped = dict(epochs[-1], epoch=3, steps=4, ema_test_acc=0.97)
    text = "\n".join(summary_lines(epochs, 12.34, 2, 1, "horovod", [], stopped))
    assert "EMA test accuracy  final 0.9700, best 0.9600 (epoch 2)" in text


def test_summary_names_only_what_is_written(tmp_path):
    """The library path (examples/cifar10_resnet18.py) writes metrics alone: the summary
    must not claim checkpoints or model.params, nor say nothing is written."""
    from hvdtrain import MetricsWriter
    from hvdtrain.loop.run.outputs import Outputs
    metrics_only = Outputs(MetricsWriter(str(tmp_path / "metrics.jsonl")))
    assert metrics_only.written() == [str(tmp_path / "metrics.jsonl")]
    assert Outputs().written() == []
    off_root = Outputs(MetricsWriter(str(tmp_path / "metrics.jsonl"), enabled=False))
    assert off_root.written() == []


def test_every_flag_says_what_it_means():
    from hvdtrain.cli import build_parser
    from hvdtrain.launch.launcher import build_parser as launch_parser
    for parser in (build_parser(), launch_parser()):
        for action in parser._actions:  # pylint: disable=protected-access
            meaning = re.sub(r"\(default: [^)]*\)", "", action.help or "").strip()
            assert meaning, f"{parser.prog} {action.option_strings}: help says nothing"
        assert "``" not in parser.format_help()


def test_help_groups_flags_and_ends_with_examples(capfd):
    # In this process (cli.main): the help needs no new interpreter.
    code, lines = main_in_process(["--help"], capfd)
    assert code == 0, lines
    text = "\n".join(lines)
    positions = [text.index(f"\n{group}:\n") for group in
                 ("data", "model", "optimisation", "distribution", "output")]
    assert positions == sorted(positions)
    words = " ".join(text.split())  # argparse wraps lines at the terminal's width
    assert "(default: 64)" in words and "(default: 0.01)" in words
    assert "(in [0, 1)) (default: 0.9)" in words  # --momentum's range, from its definition
    tail = text[text.index("examples:"):].strip().splitlines()
    assert sum(l.strip().startswith(("hvdtrain", "horovodrun")) for l in tail) == 3
