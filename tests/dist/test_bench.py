"""The benchmark's workers run under horovodrun and report sane figures (not their speed:
speed is judged by `make bench`, never by tests)."""
import glob
import json
import os
import sys

import pytest

from helpers import REPO, run_command, timeline_phases
from hvdtrain.data import write_cifar_files
from jobs import JOB_TIMEOUT, launcher

pytestmark = pytest.mark.dist
WORKER = os.path.join(REPO, "scripts", "bench_worker.py")


@pytest.mark.parametrize("flags", [
    ["--impl", "plain", "--data", "synthetic", "--instrument"],
    ["--impl", "hvdtrain", "--data", "cifar", "--instrument"],
    # Every ablation switch and the option at once: all of them must still train.
    ["--impl", "hvdtrain", "--data", "synthetic", "--grad-bucket-mb", "0", "--log-interval",
     "1", "--data-workers", "0", "--no-hybridize", "--fp16-allreduce"],
], ids=["plain", "hvdtrain-cifar", "hvdtrain-ablations"])
def test_bench_worker_reports_each_rank(flags, tmp_path):
    write_cifar_files(str(tmp_path / "cifar"), num_train=256, num_test=16)
    prefix = str(tmp_path / "run")
    proc = run_command(launcher("horovodrun") + [
        sys.executable, WORKER, "--data-dir", str(tmp_path / "cifar"), "--steps", "2",
        "--warmup", "1", "--batch-size", "16", "--out", prefix] + flags,
        timeout=JOB_TIMEOUT, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = [json.load(open(f)) for f in sorted(glob.glob(prefix + ".rank*.json"))]
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        assert record["ranks"] == 2 and record["img_per_sec"] > 0
        assert record["peak_rss_mb"] > 100  # MXNet alone takes more: the figure is real
        if "--instrument" in flags:
            assert 0 < record["allreduce_share"] < 1
        else:
            assert record["allreduce_share"] == 0


@pytest.mark.parametrize("copied", [True, False], ids=["copied-buckets", "zero-copy"])
def test_bench_before_row_copies_through_fusion_buffer(copied, tmp_path):
    """The bench's "before zero-copy" row measures what it names: its buckets are copied
    into Horovod's fusion buffer, and today's loop in the same worker copies none."""
    timeline = tmp_path / "timeline.json"
    proc = run_command(launcher("horovodrun") + [
        sys.executable, WORKER, "--impl", "hvdtrain", "--data", "synthetic", "--model",
        "simple_cnn", "--grad-bucket-mb", "0.002", "--steps", "2", "--warmup", "1",
        "--batch-size", "16", "--out", str(tmp_path / "run")]
        + (["--copied-buckets"] if copied else []),
        timeout=JOB_TIMEOUT, env={"OMP_NUM_THREADS": "1", "HOROVOD_TIMELINE": str(timeline)})
    assert proc.returncode == 0, proc.stdout[-3000:]
    phases = timeline_phases(timeline)
    # Gradients: every allreduce but the loop's bookkeeping sums.
    gradients = {row: seen for row, seen in phases.items() if "MPI_ALLREDUCE" in seen
                 and not row.endswith(("finite_check", "train_totals"))}
    assert len(gradients) > 1, sorted(phases)
    copied_rows = sorted(row for row, seen in gradients.items()
                         if "MEMCPY_IN_FUSION_BUFFER" in seen)
    assert copied_rows == (sorted(gradients) if copied else []), gradients
