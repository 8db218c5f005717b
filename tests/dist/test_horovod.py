"""Real Horovod jobs with two ranks on this host, under each launcher."""
import json
import os
import re
import sys

import numpy as np
import pytest

from helpers import run_command, timeline_phases, tool
from jobs import DIGITS, JOB_TIMEOUT, LAUNCHERS, assert_same_params, launcher, run_ranks
from plain_gluon import epoch_order, global_batches, train_plain
from hvdtrain.data.datasets import (CIFAR_MEAN, CIFAR_STD, CIFAR_TEST_FILE, load_digits,
                                    write_cifar_files)

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("name", LAUNCHERS)
def test_digits_trains_and_ranks_agree(name, tmp_path):
    results, params, _ = run_ranks(launcher(name), tmp_path,
                                   DIGITS + ["--epochs", "10", "--lr", "0.05"])
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["num_workers"] == 2 and r["local_size"] == 2 for r in results)
    assert sorted(r["local_rank"] for r in results) == [0, 1]
    assert results[0]["test_acc"] >= 0.95, results
    assert results[0]["test_acc"] == results[1]["test_acc"]
    assert results[0]["test_count"] == results[1]["test_count"] == 360
    assert_same_params(params[0], params[1])


SEED, LR = 42, 0.1


def plain_reference(model, start, global_batch, steps, **kwargs):
    """The independent side (tests/plain_gluon.py): a plain Gluon Trainer (kvstore=None) in
    this process, from the arrays a run started with, stepping once per global batch of
    the documented strided order. `steps`: a number, or the list of index arrays."""
    data = load_digits()
    if isinstance(steps, int):
        steps = global_batches(len(data.train_y), SEED, global_batch, max_steps=steps)
    return train_plain(model, start, data.train_x, data.train_y, steps, LR, **kwargs)[0]


def start_arrays(folder, rank=0):
    """What rank `rank` held as training started (rank_worker.py, HVDTRAIN_DUMP_START=1)."""
    return dict(np.load(os.path.join(folder, f"rank{rank}-start.npz")))


DUMP_START = {"HVDTRAIN_DUMP_START": "1"}


def test_two_workers_match_one_worker_with_twice_the_batch(tmp_path):
    """The documented sampling mode: 2 workers x batch 16 (strided) and 1 worker x batch
    32 both train what a plain Gluon Trainer computes on the global batch of 32, positions
    32k .. 32k+31 of the (seed, epoch) order at step k."""
    flags = DIGITS + ["--sampling", "strided", "--max-steps", "5", "--lr", str(LR),
                      "--model", "simple_cnn", "--seed", str(SEED)]
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    _, two, _ = run_ranks(launcher("ranks"), tmp_path / "two",
                          flags + ["--batch-size", "16"], env=DUMP_START)
    _, one, _ = run_ranks([], tmp_path / "one", flags + ["--batch-size", "32"],
                          env=DUMP_START)
    start = start_arrays(tmp_path / "two")
    assert_same_params(start_arrays(tmp_path / "two", 1), start)
    assert_same_params(start_arrays(tmp_path / "one"), start)
    assert_same_params(two[1], two[0])
    reference = plain_reference("simple_cnn", start, 32, 5)
    assert_same_params(two[0], reference, tol=1e-5)
    assert_same_params(one[0], reference, tol=1e-5)
    # The comparison must be able to fail: the same number of samples per step, but the
    # two halves that contiguous sampling would give the ranks (blocks of 719 positions),
    # trains a model outside the tolerance.
    order = epoch_order(SEED, 0, 1437)
    blocks = [(0, np.concatenate([order[16 * k:16 * k + 16], order[719 + 16 * k:735 + 16 * k]]))
              for k in range(5)]
    with pytest.raises(AssertionError):
        assert_same_params(two[0], plain_reference("simple_cnn", start, 32, blocks),
                           tol=1e-5)


BUCKET_OPTIONS = {"static": [], "imperative-fp16": ["--no-hybridize", "--fp16-allreduce"]}


@pytest.fixture(scope="module")
def bucket_runs(tmp_path_factory):
    """{option: {cap: (rank 0's results, each rank's parameters, rank 0's starting
    arrays)}} and rank 0's timeline of the static run with many small buckets: five short
    jobs serving the two tests below."""
    root = tmp_path_factory.mktemp("buckets")
    timeline = root / "timeline.json"
    runs = {}
    for option, extra in BUCKET_OPTIONS.items():
        runs[option] = {}
        for cap in ("0", "0.002", "25") if option == "static" else ("0", "0.002"):
            folder = root / f"{option}-{cap}"
            folder.mkdir()
            watch = ["--horovod-timeline", str(timeline)] \
                if (option, cap) == ("static", "0.002") else []
            results, params, _ = run_ranks(
                launcher("ranks"), folder,
                DIGITS + ["--max-steps", "5", "--lr", str(LR), "--model", "simple_cnn",
                          "--seed", str(SEED), "--sampling", "strided",
                          "--grad-bucket-mb", cap] + extra + watch, env=DUMP_START)
            runs[option][cap] = results[0], params, start_arrays(folder)
    return runs, timeline


@pytest.mark.parametrize("option", list(BUCKET_OPTIONS))
def test_gradient_buckets_leave_the_result_unchanged(option, bucket_runs):
    """Zero-copy buckets (gradients as views into one flat buffer per bucket, one in-place
    allreduce each) and the Trainer's own one-call-per-parameter exchange, with static
    graphs, and imperatively with float16 on the wire (cast per bucket vs per key), against
    an independent reference: a plain Gluon Trainer on the global batch of 2 x 64, the
    gradients of the two ranks' halves added (with float16 on the wire: each cast to
    float16 and summed in float16).
    Gluon's contract in each graph mode, case by case, is tests/dist/test_buckets.py's."""
    runs = bucket_runs[0][option]
    start = runs["0"][2]
    for cap, (_, params, started) in runs.items():
        assert_same_params(started, start)  # every run starts from the same arrays
        # A bucket left out of the exchange would let the two shards' replicas drift apart.
        assert_same_params(params[0], params[1])
    buckets = {cap: results["grad_buckets"] for cap, (results, _, _) in runs.items()}
    assert buckets["0"] == 0  # the Trainer's own exchange, one call per parameter
    assert buckets["0.002"] > 1
    if "25" in buckets:
        assert buckets["25"] == 1
        assert_same_params(runs["25"][1][0], runs["0"][1][0], tol=1e-6)
    assert_same_params(runs["0.002"][1][0], runs["0"][1][0], tol=1e-6)
    # Each rank's 64 samples make one gradient sum; the reference adds the two sums as
    # the exchange does (a sum over all 128 at once differs by rounding, which this
    # ReLU and max-pooling net can blow up at a tie: plain_gluon.train_plain).
    wire = {"wire_dtype": np.float16} if "fp16" in option else {}
    reference = plain_reference("simple_cnn", start, 128, 5, shares=2, **wire)
    for cap, (_, params, _) in runs.items():
        # Seen bit-identical here (a hybridized graph or not); 1e-5 per unit leaves room
        # for kernels that round otherwise, while a bucket left out of the exchange, or
        # float16 on the wire where float32 was asked for, moves weights by far more.
        assert_same_params(params[0], reference, tol=1e-5)


def test_timeline_shows_buckets_reduced_in_place(bucket_runs):
    """--horovod-timeline FILE: rank 0 writes Horovod's Chrome trace. It names our
    collectives, and shows what zero-copy buckets promise: no bucket is ever copied into
    Horovod's fusion buffer (many small buckets, all ready within one cycle, would be)."""
    phases = timeline_phases(bucket_runs[1])
    buckets = {row: seen for row, seen in phases.items() if "allreduce.bucket." in row}
    assert len(buckets) > 1 and any("broadcast." in row for row in phases), sorted(phases)
    for row, seen in buckets.items():
        assert "MPI_ALLREDUCE" in seen and "MEMCPY_IN_FUSION_BUFFER" not in seen, (row, seen)


def test_cli_logs_info_from_rank0_only_and_writes_outputs(tmp_path):
    out = tmp_path / "run"
    proc = run_command([tool("horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2",
                        tool("hvdtrain"), "--dataset", "digits", "--epochs", "2",
                        "--log-interval", "5", "--output-dir", str(out)], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    info = [l for l in proc.stdout.splitlines() if " INFO " in l]
    warnings = [l for l in proc.stdout.splitlines() if " WARNING " in l]
    assert info and all("[rank 0]" in l and l.startswith("[0]") for l in info)
    # No GPU here and no --no-cuda: every rank warns, not only rank 0.
    assert {re.match(r"\[(\d)\]", l).group(1) for l in warnings
            if "no GPU is visible" in l} == {"0", "1"}
    assert sum("epoch 1/2" in l for l in info) == 1
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["start", "epoch", "epoch", "end"]
    epoch = records[1]
    for key in ("epoch", "step", "train_loss", "train_acc", "test_acc", "samples_per_sec",
                "epoch_time", "lr", "num_workers", "batch_size"):
        assert key in epoch
    assert (epoch["epoch"], epoch["num_workers"], epoch["batch_size"]) == (0, 2, 64)
    assert records[-1]["test_acc"] == records[2]["test_acc"]
    assert (out / "model.params").stat().st_size > 0
    assert sorted(os.listdir(out)) == [".hvdtrain.lock", "checkpoints", "metrics.jsonl",
                                       "model.json", "model.params"]


def test_uneven_files_and_float16_gradients_keep_metrics_exact(tmp_path):
    """Uneven CIFAR files (101 training and 33,001 test samples over 2 ranks) do not hang
    and score each test sample once; with --fp16-allreduce, only gradients travel as
    float16. 33,001 is rounded in float16 (to 32,992) and the loss sum (about 2.3 x 33,001)
    overflows it. (One run serves both; they were two tests of their own.)"""
    data_dir = tmp_path / "cifar"
    write_cifar_files(str(data_dir), num_train=101, num_test=33001)
    out = tmp_path / "out"
    out.mkdir()
    results, params, _ = run_ranks(
        launcher("ranks"), out,
        ["--dataset", "cifar10", "--data-dir", str(data_dir), "--model", "mlp", "--no-cuda",
         "--batch-size", "16", "--epochs", "2", "--log-interval", "0", "--fp16-allreduce",
         "--output-dir", str(out / "run")], timeout=JOB_TIMEOUT)
    assert [r["steps"] for r in results] == [8, 8]  # ceil(51 / 16) steps x 2 epochs
    assert [r["test_count"] for r in results] == [33001, 33001]
    records = [json.loads(l) for l in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    epoch = [r for r in records if r["event"] == "epoch"][-1]
    assert 0.5 < epoch["test_loss"] < 20 and 0.5 < epoch["train_loss"] < 20, epoch
    assert_same_params(params[0], params[1])
    # Both ranks report one figure, and it is the trained MLP's accuracy over all 33,001 test
    # samples as numpy computes it in float64 from the raw file: a sample whose two top logits
    # agree to float32 rounding may flip, hence the margin of 2 samples.
    assert results[0]["test_acc"] == results[1]["test_acc"] == epoch["test_acc"]
    assert abs(epoch["test_acc"] * 33001 - numpy_test_correct(data_dir, params[0])) <= 2


def numpy_test_correct(data_dir, arrays):
    """Test samples the MLP `arrays` (Flatten, Dense+relu, Dense) classifies right, computed
    with numpy from the CIFAR binary file, normalised as CIFAR's channel mean and std say."""
    raw = np.fromfile(os.path.join(data_dir, CIFAR_TEST_FILE), dtype=np.uint8).reshape(-1, 3073)
    labels, pixels = raw[:, 0], raw[:, 1:].reshape(-1, 3, 32 * 32) / 255.0
    mean, std = np.array(CIFAR_MEAN)[:, None], np.array(CIFAR_STD)[:, None]
    x = ((pixels - mean) / std).reshape(len(raw), -1)
    hidden = np.maximum(x @ arrays["1.weight"].T.astype(np.float64) + arrays["1.bias"], 0)
    logits = hidden @ arrays["2.weight"].T.astype(np.float64) + arrays["2.bias"]
    return int((logits.argmax(axis=1) == labels).sum())
