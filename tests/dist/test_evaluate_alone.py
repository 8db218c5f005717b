"""``evaluate()`` without ``fit`` scores one model: ranks whose weights differ (each
initialised its own) are made one before scoring (rank 0's weights, with a warning), and the
figure every rank reports is that model's over the whole split, computed here by NumPy; under
replica_check='strict' every rank stops with one line instead. Before, each rank scored its
own weights on its own shard and every rank reported the blend."""
import json
import os
import re
import sys

import numpy as np
import pytest

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import regression  # noqa: E402

pytestmark = pytest.mark.dist
TAG = re.compile(r"\[1,\d+\]<std\w+>:")  # mpirun's tags, wherever they fall
PROGRAM = os.path.join(HERE, "evaluate_program.py")


def numpy_rmse(arrays):
    """The regression net (Dense 32 relu, Dense 32 relu, Dense 1) over the whole split."""
    x, y = regression.make_data(37, 2)
    h = x
    for layer in range(3):
        h = h @ arrays[f"{layer}.weight"].T + arrays[f"{layer}.bias"]
        if layer < 2:
            h = np.maximum(h, 0)
    return float(np.sqrt(((h.reshape(-1) - y.reshape(-1)) ** 2).mean()))


def test_evaluate_alone_scores_rank_0s_model_on_every_rank(tmp_path):
    proc = run_command(launcher("ranks", 2) + [sys.executable, PROGRAM, str(tmp_path)],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    arrays = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in (0, 1)]
    assert_same_params(arrays[0], arrays[1])
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert reports[0]["val_count"] == reports[1]["val_count"] == 37
    expected = numpy_rmse(arrays[0])
    for report in reports:
        assert abs(report["rmse"] - expected) <= 1e-5 * expected, (report, expected)
    warned = [l for l in proc.stdout.splitlines() if "replicas differ at evaluate()" in l]
    assert len(warned) == 1 and "on rank 1" in warned[0], proc.stdout[-2000:]
    assert "[rank 0] WARNING" in warned[0]  # hvdtrain's log line, set up outside fit too


def test_evaluate_alone_under_strict_stops_every_rank_with_one_line(tmp_path):
    proc = run_command(launcher("ranks", 2) + [sys.executable, PROGRAM, str(tmp_path),
                                               "replica_check=strict"], timeout=JOB_TIMEOUT)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    lines = [l for l in proc.stdout.splitlines() if "error: replicas differ at evaluate()" in l]
    assert len(lines) == 2, proc.stdout[-3000:]
    assert not (tmp_path / "rank0.json").exists()


def test_evaluate_alone_on_a_rank_with_no_usable_sample_stops_every_rank_alike(tmp_path):
    """One validation sample at 2 ranks: rank 1's shard is empty and the net's shapes are
    still deferred, so rank 1 cannot settle them. Every rank stops with the same line and
    status 2 (issue 63, finding 5); before, rank 1 refused alone and rank 0 waited in the
    replica check's collective until the launcher's timeout."""
    proc = run_command(launcher("ranks", 2) + [sys.executable, PROGRAM, str(tmp_path),
                                               "val=1"], timeout=90)
    assert proc.returncode == 2, proc.stdout[-3000:]
    lines = [TAG.sub("", l.split(":", 1)[1]) for l in proc.stdout.splitlines()
             if "evaluate_program.py: error:" in l]
    assert len(lines) == 2 and len(set(lines)) == 1, proc.stdout[-3000:]
    assert "this rank's share of the data holds no usable sample" in lines[0]
    assert "(rank 1; every rank stopped at evaluate_usable)" in lines[0]
