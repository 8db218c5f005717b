"""hvdtrain-check's verdict, table and data check (rankfacts, preflight) in one process."""
import contextlib
import os
import subprocess
import sys

import pytest

from hvdtrain.data.datasets import CIFAR_TEST_FILE, write_cifar_files
from hvdtrain.check.preflight import launched_by_mpi, main
from hvdtrain.check.rankfacts import (COLUMNS, check_data_dir, collect, format_report, judge,
                                      one_line)


def facts(rank, **changes):
    base = {"rank": rank, "local": rank % 2, "host": "h%d" % (rank // 2), "problems": [],
            "python": "3.11 /venv/bin/python", "hvdtrain": "0.1.0", "hvdtrain_path": "/a",
            "mxnet": "1.9.1", "mxnet_path": "/m", "horovod": "0.28.1", "horovod_path": "/h",
            "numpy": "1.23.5", "numpy_path": "/n", "build": "MPI+Gloo", "GPUs": "0",
            "device": "cpu(0)", "device_kind": "cpu", "data": "-"}
    base.update(changes)
    return base


def test_the_rank_that_differs_from_the_majority_is_named():
    ranks = [facts(0), facts(1), facts(2, mxnet="1.9.0"), facts(3)]
    reference, problems = judge(ranks)
    assert reference["mxnet"] == "1.9.1"
    assert problems == {0: [], 1: [], 2: ["mxnet 1.9.0 (most ranks: 1.9.1)"], 3: []}


def test_a_tie_is_settled_by_the_lowest_rank():
    _, problems = judge([facts(0), facts(1, numpy="1.24.0", numpy_path="/other")])
    assert not problems[0] and len(problems[1]) == 2


def test_a_rank_that_cannot_run_is_named_even_when_alike():
    ranks = [facts(0), facts(1, problems=["cannot read /d/test_batch.bin: Permission denied"])]
    table, failed = format_report(ranks)
    assert failed == [1]
    lines = table.splitlines()
    assert "rank 1 (h0): cannot read /d/test_batch.bin: Permission denied" in lines
    assert lines[-1] == "1 of 2 ranks ready; ranks that differ or cannot run a job: 1"
    rows = [l.split() for l in lines if l.split() and l.split()[0].isdigit()
            and len(l.split()) == len(COLUMNS)]
    assert [r[-1] for r in rows] == ["ok", "FAIL"]


def test_data_dir_check(tmp_path):
    write_cifar_files(str(tmp_path / "ok"), num_train=10, num_test=4)
    cell, problem = check_data_dir(str(tmp_path / "ok"))
    assert cell.startswith("ok(") and problem is None
    assert check_data_dir(str(tmp_path / "none"))[1].endswith("is not a folder on this host")
    os.remove(tmp_path / "ok" / CIFAR_TEST_FILE)
    assert "cannot read" in check_data_dir(str(tmp_path / "ok"))[1]
    (tmp_path / "ok" / CIFAR_TEST_FILE).write_bytes(b"\0" * 100)
    assert "not a whole number of CIFAR-10 records" in check_data_dir(str(tmp_path / "ok"))[1]


def test_this_process_collects_its_own_facts(tmp_path):
    mine = collect(0, 0, data_dir=str(tmp_path))
    assert mine["hvdtrain"] == "0.1.0" and mine["mxnet"] == "1.9.1"
    assert mine["build"] == "MPI+Gloo" and mine["device"] == "cpu(0)"
    assert mine["data"] == "FAIL" and "cannot read" in mine["problems"][0]


def test_mpi_is_detected_from_the_launcher_environment():
    assert launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    assert not launched_by_mpi({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"})


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--size-mb", "-1"], ["--bogus"]])
def test_bad_usage_is_one_line_and_exit_2(argv, capsys):
    # argparse leaves through SystemExit(2); the range checks return 2
    with pytest.raises(SystemExit) if argv == ["--bogus"] else contextlib.nullcontext():
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err


def test_single_process_without_launcher():
    # Not the variables an MPI singleton (an hvd.init() in this process) leaves behind.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.check.preflight", "--size-mb", "0.1",
                           "--rounds", "1"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 of 1 ranks ready" in proc.stdout and "through the Horovod store" in proc.stdout


class _FakeRank:
    """Rank 0 of two, with a store that adds what the other rank (value 2) would send, or,
    when `broken`, returns its input as if the other rank were not there."""

    rank, num_workers = 0, 2

    def __init__(self, broken):
        self.broken = broken
        self.store = self

    def pushpull(self, key, value):
        if not self.broken:
            value += 2

    def sum_across_workers(self, name, values):
        return values


@pytest.mark.parametrize("broken", [False, True])
def test_allreduce_sums_are_checked(broken):
    import mxnet as mx

    from hvdtrain.check.preflight import format_bandwidth, measure_allreduce

    measured = measure_allreduce(_FakeRank(broken), mx.cpu(), size_mb=0.01, rounds=2)
    assert measured["wrong_ranks"] == (1 if broken else 0)
    assert measured["bytes"] == 10484 and measured["best_s"] <= measured["median_s"]
    line = format_bandwidth(measured, 2, mx.cpu(), 2)
    assert ("WRONG sums on 1 ranks" in line) == broken


def test_help_says_what_data_dir_checks_now():
    """--help said --data-dir checks "readable CIFAR-10 files": it opens image folders and
    RecordIO packs as training does, and compares them across ranks."""
    from hvdtrain.check.preflight import build_parser
    text = " ".join(build_parser().format_help().split())
    assert "readable CIFAR-10 files" not in text
    for needle in ("image folder train/<class>/", "RecordIO pack train.rec/.idx",
                   "CIFAR-10 binary files", "every rank holds the same images or pack"):
        assert needle in text, (needle, text)


def test_an_error_is_named_by_its_type_once():
    """MXNet's errors start with their type already: "MXNetError: MXNetError: ..." was
    printed by a rank whose Horovod had shut down under hvdtrain-check (issue 63)."""
    import mxnet as mx
    assert one_line(ValueError("bad\nmore")) == "ValueError: bad"
    assert one_line(mx.base.MXNetError("MXNetError: Horovod has been shut down.")) == \
        "MXNetError: Horovod has been shut down."
