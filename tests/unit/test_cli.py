"""`hvdtrain` as users call it: bad input is one line and exit status 2."""
import pytest

from helpers import main_in_process, run_command, tool


@pytest.mark.parametrize("flags,needle", [
    (["--batch-size", "0"], "--batch-size must be positive"),
    (["--epochs", "-1"], "--epochs must be positive"),
    (["--model", "resnet9000"], "unknown model 'resnet9000'; choose one of"),
    (["--dataset", "mnist"], "argument --dataset: invalid choice"),
    (["--batch-size", "many"], "argument --batch-size: invalid int value"),
    (["--dataset", "cifar10"], "needs --data-dir"),
    (["--dataset", "cifar10", "--data-dir", "/nonexistent/cifar"],
     "CIFAR-10 binary files missing in /nonexistent/cifar"),
    (["--output-dir", "/proc/hvdtrain-out"], "--output-dir /proc/hvdtrain-out is not writable"),
    (["--tensorboard", "/proc/x"], "--tensorboard /proc/x is not writable"),
    (["--tensorboard", "/etc/passwd"], "--tensorboard /etc/passwd is a file, not a folder"),
    (["--lr", "inf"], "--lr must be a finite number, got inf"),
    (["--momentum", "5"], "--momentum must be in [0, 1), got 5.0"),
    (["--lr=-inf"], "--lr must be a finite number, got -inf"),
])
def test_bad_input_is_one_line_and_exit_2(flags, needle, capfd):
    # In process (cli.main): test_a_refusal_is_one_line_from_the_whole_process covers what
    # a real process adds around it.
    code, lines = main_in_process(BASE + flags, capfd)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain: error: ") and needle in lines[0]


BASE = ["--dataset", "digits", "--no-cuda", "--kvstore", "none", "--epochs", "1"]


@pytest.mark.parametrize("flags,needle", [
    (["--batch-size", "many"], "argument --batch-size: invalid int value"),  # argparse
    (["--lr", "inf"], "--lr must be a finite number, got inf"),  # TrainConfig
    (["--dataset", "cifar10", "--data-dir", "/nonexistent/cifar"],  # after MXNet's import
     "CIFAR-10 binary files missing in /nonexistent/cifar"),
])
def test_a_refusal_is_one_line_from_the_whole_process(flags, needle):
    proc = run_command([tool("hvdtrain")] + BASE + flags, timeout=120)
    assert proc.returncode == 2, proc.stdout
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("hvdtrain: error: ") and needle in lines[0]


def test_help_states_the_lr_semantics_and_examples(capfd):
    # In this process (cli.main): the help needs no new interpreter.
    code, lines = main_in_process(["--help"], capfd)
    assert code == 0, lines
    text = " ".join(" ".join(lines).split())
    assert "learning rate for the GLOBAL batch" in text
    assert "horovodrun -np 8 -H d1:4,d2:4 hvdtrain" in text


def test_single_worker_without_launcher(tmp_path):
    proc = run_command([tool("hvdtrain"), "--dataset", "digits", "--no-cuda", "--max-steps", "3",
                        "--output-dir", str(tmp_path)], timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "1 worker(s) x 1 device(s) x batch 64" in proc.stdout
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "model.params").exists()


def test_a_peer_gone_is_one_line_not_a_traceback(monkeypatch, capfd):
    """When another rank vanished, Horovod fails this rank's next collective with "Horovod
    has been shut down"; the user sees one line (the other rank's says why) and exit 1."""
    import mxnet as mx
    import hvdtrain.cli as cli

    def peer_gone(cfg):
        raise mx.base.MXNetError("MXNetError: Horovod has been shut down. This was caused by "
                                 "an exception on one of the ranks or an attempt to allreduce")
    monkeypatch.setattr(cli, "train", peer_gone)
    code, lines = main_in_process(BASE, capfd)
    assert code == 1
    assert lines == ["hvdtrain: error: Horovod has been shut down: another rank failed or "
                     "left the job (see its output)"]


@pytest.mark.parametrize("store", ["dist_sync", "dist_async"])
def test_a_parameter_server_store_outside_its_launcher_is_one_line(store, capfd, monkeypatch):
    """Without hvdtrain-launch (no DMLC_ROLE) MXNet stopped on a C++ check with a
    traceback; now one line names the launcher."""
    from helpers import main_in_process
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    code, lines = main_in_process(["--dataset", "digits", "--no-cuda", "--epochs", "1",
                                   "--kvstore", store], capfd)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"hvdtrain: error: --kvstore {store} runs under the "
                               f"parameter-server launcher: start it with hvdtrain-launch"), lines
