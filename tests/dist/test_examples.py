"""Every script in examples/ runs, on tiny data."""
import json
import os
import re
import sys

import numpy as np
import pytest

from helpers import REPO, run_command
from hvdtrain.data.datasets import write_cifar_files
from jobs import JOB_TIMEOUT, launcher

pytestmark = pytest.mark.dist
EXAMPLES = os.path.join(REPO, "examples")


def test_cifar10_resnet18(tmp_path):
    write_cifar_files(str(tmp_path / "cifar"), num_train=200, num_test=40)
    proc = run_command(launcher("ranks") + [
        sys.executable, os.path.join(EXAMPLES, "cifar10_resnet18.py"),
        "--data-dir", str(tmp_path / "cifar"), "--epochs", "1", "--max-steps", "2",
        "--batch-size", "16", "--no-cuda", "--output-dir", str(tmp_path / "out")],
        timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "test accuracy" in proc.stdout and "on 40 images" in proc.stdout
    assert (tmp_path / "out" / "metrics.jsonl").exists()


def test_custom_model_learns_its_own_data():
    proc = run_command(launcher("ranks") + [
        sys.executable, os.path.join(EXAMPLES, "custom_model.py"), "--epochs", "20"],
        timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    accuracy = float(re.search(r"<stdout>:test accuracy (\d\.\d+)", proc.stdout).group(1))
    assert accuracy > 0.75, proc.stdout[-2000:]  # two classes: chance is 0.5


def test_parameter_server_script(tmp_path):
    """The script as docs/training.md runs it (with --output-dir); it is also the job of
    docs/parameter-server.md's first line (test_readme_commands.RUN_ELSEWHERE)."""
    proc = run_command([os.path.join(EXAMPLES, "parameter_server.sh"), "--epochs", "1",
                        "--output-dir", str(tmp_path / "ps")], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "store: dist_sync" in proc.stdout and "run summary" in proc.stdout
    records = [json.loads(l) for l in (tmp_path / "ps" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["event"] for r in records] == ["start", "epoch", "end"]
    assert records[1]["num_workers"] == 2


def test_cifar10_example_names_missing_data_in_one_line(tmp_path):
    proc = run_command([sys.executable, os.path.join(EXAMPLES, "cifar10_resnet18.py"),
                        "--data-dir", str(tmp_path / "nothing")], timeout=JOB_TIMEOUT)
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert "CIFAR-10 binary files missing" in lines[0]


def test_sweep_mpi_trains_two_independent_runs_on_sub_communicators(tmp_path):
    import mxnet as mx

    out = tmp_path / "sweep"
    proc = run_command(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                        "-np", "4", "-x", "PATH", sys.executable,
                        os.path.join(EXAMPLES, "sweep_mpi.py"), "--lr", "0.05", "--lr", "0.2",
                        "--runs-dir", str(out), "--dataset", "digits", "--no-cuda",
                        "--epochs", "2", "--log-interval", "0"], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = sorted(l for l in proc.stdout.splitlines() if l.startswith("sweep: "))
    assert len(lines) == 2, proc.stdout[-3000:]
    assert lines[0].startswith("sweep: lr 0.05 on world ranks 0,1 (2 workers)")
    assert lines[1].startswith("sweep: lr 0.2 on world ranks 2,3 (2 workers)")
    assert all("replicas agree" in l for l in lines), lines
    finals = {}
    for lr in ("0.05", "0.2"):
        records = [json.loads(l) for l in (out / f"lr{lr}" / "metrics.jsonl").read_text()
                   .splitlines()]
        epochs = [r for r in records if r["event"] == "epoch"]
        assert len(epochs) == 2 and {r["num_workers"] for r in epochs} == {2}
        assert {r["lr"] for r in epochs} == {float(lr)}
        finals[lr] = mx.nd.load(str(out / f"lr{lr}" / "model.params"))
    # Two runs, not one: the same seed and data but another rate give other parameters.
    a, b = finals["0.05"], finals["0.2"]
    assert sorted(a) == sorted(b)
    assert any(not np.array_equal(a[k].asnumpy(), b[k].asnumpy()) for k in a)


@pytest.mark.parametrize("which", ["folder", "pack"])
def test_custom_model_trains_on_a_folder_and_a_pack(digit_images, which):
    folder, pack = digit_images
    proc = run_command(launcher("ranks") + [
        sys.executable, os.path.join(EXAMPLES, "custom_model.py"), "--data-dir",
        folder if which == "folder" else pack, "--epochs", "1", "--max-steps", "3"],
        timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    kind = "imagefolder" if which == "folder" else "recordio"
    assert f"on 120 images of 10 classes ({kind})" in proc.stdout, proc.stdout[-2000:]
