"""Every rank holds the same model in every array, BatchNorm running statistics included."""
import mxnet as mx
import numpy as np
import pytest

from helpers import tool
from jobs import DIGITS, assert_same_params, launcher, run_ranks

pytestmark = pytest.mark.dist

BN_FLAGS = DIGITS + ["--model", "bn_cnn", "--lr", "0.1", "--batch-size", "32"]


def saved_arrays(path):
    return {name: array.asnumpy() for name, array in mx.nd.load(str(path)).items()}


def test_batchnorm_model_is_identical_on_every_rank_and_in_the_saved_files(tmp_path):
    out = tmp_path / "run"
    results, params, log = run_ranks(launcher("ranks"), tmp_path,
                                     BN_FLAGS + ["--epochs", "2", "--output-dir", str(out)],
                                     env={"HVDTRAIN_DUMP_START": "1"})
    stats = [k for k in params[0] if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 4, sorted(params[0])
    # Before the first step: rank 0's arrays everywhere (the ranks were seeded apart).
    start = [dict(np.load(tmp_path / f"rank{r}-start.npz")) for r in (0, 1)]
    assert_same_params(start[0], start[1])
    # Each rank trained its BatchNorm statistics on its own half of every batch; they were
    # averaged before each evaluation and save, in place on both ranks.
    # One collective sums them and every rank divides the same bytes: bit-identical.
    assert_same_params(params[0], params[1])
    assert not np.allclose(params[0][stats[1]], start[0][stats[1]])
    assert results[0]["test_acc"] == results[1]["test_acc"]
    # What was evaluated is what was saved: model.params and the last checkpoint.
    # Saving is a copy: exact.
    assert_same_params(saved_arrays(out / "model.params"), params[0])
    assert_same_params(saved_arrays(out / "checkpoints" / "epoch-0002" / "model.params"),
                       params[0])
    assert "Traceback" not in log


def test_batchnorm_model_agrees_on_the_parameter_server(tmp_path):
    # The same averaging through MXNet's dist_sync store (keys it must initialise first).
    results, params, _ = run_ranks([tool("hvdtrain-launch"), "-n", "2", "-s", "1"], tmp_path,
                                   BN_FLAGS + ["--kvstore", "dist_sync", "--epochs", "1"])
    assert [r["rank"] for r in results] == [0, 1]
    assert_same_params(params[0], params[1], tol=1e-6)
    assert results[0]["test_acc"] == results[1]["test_acc"]
