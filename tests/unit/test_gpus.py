"""GPUs MXNet's CUDA build cannot run on are refused in one line, before any GPU work.

No GPU here: the capability reader (hvdtrain.store.gpus.read_gpus) and MXNet's GPU count are
faked; only a GPU host shows that read_gpus reads the real capability through libcuda.
"""
import os
import subprocess

import mxnet as mx
import pytest

from helpers import REPO
from hvdtrain import cli
from hvdtrain.store import gpus
from hvdtrain.config import ConfigError
from hvdtrain.store.dist import select_devices

H100 = gpus.Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0))
A100 = gpus.Gpu(0, "NVIDIA A100-SXM4-40GB", (8, 0))


def _fake_host(monkeypatch, *found):
    monkeypatch.setattr(mx.context, "num_gpus", lambda: len(found))
    monkeypatch.setattr(gpus, "read_gpus", lambda: list(found))


@pytest.mark.parametrize("capability,runs", [
    ((3, 7), False), ((5, 0), True), ((5, 2), True), ((6, 1), True), ((7, 5), True),
    ((8, 0), True), ((8, 6), True), ((8, 9), True), ((9, 0), False), ((10, 0), False),
    ((12, 0), False)])
def test_capabilities_mxnet_cu112_runs_on(capability, runs):
    assert gpus.runs_on(capability) is runs


def test_supported_range_follows_the_kernel_list():
    low, high = gpus.SUPPORTED_RANGE.split("-")
    assert gpus.runs_on(tuple(map(int, low.split(".")))) and \
        gpus.runs_on(tuple(map(int, high.split("."))))
    assert not gpus.runs_on((int(low[0]) - 1, 9)) and not gpus.runs_on((int(high[0]) + 1, 0))


def test_hopper_is_refused_naming_the_gpu_and_the_range(monkeypatch):
    _fake_host(monkeypatch, H100, gpus.Gpu(1, "NVIDIA H100 80GB HBM3", (9, 0)))
    with pytest.raises(ConfigError) as err:
        select_devices(local_rank=0)
    message = str(err.value)
    assert "GPU 0 (NVIDIA H100 80GB HBM3) has compute capability 9.0" in message
    assert gpus.SUPPORTED_RANGE in message and "\n" not in message


def test_only_the_gpus_this_worker_drives_are_checked(monkeypatch):
    _fake_host(monkeypatch, A100, gpus.Gpu(1, "NVIDIA H100 PCIe", (9, 0)))
    assert select_devices(local_rank=0) == [mx.gpu(0)]
    with pytest.raises(ConfigError, match="GPU 1 .NVIDIA H100 PCIe."):
        select_devices(local_rank=1)


def test_hvdtrain_stops_with_one_line_and_exit_2_on_an_unsupported_gpu(monkeypatch, capsys):
    _fake_host(monkeypatch, H100)
    code = cli.main(["--dataset", "digits", "--kvstore", "none", "--max-steps", "1"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == cli.EXIT_USAGE, err
    assert len(lines) == 1, err
    assert lines[0].startswith("hvdtrain: error: GPU 0 (NVIDIA H100 80GB HBM3)")


def test_asking_for_a_gpu_that_is_not_there_is_a_usage_error(monkeypatch, capsys):
    _fake_host(monkeypatch, A100)
    code = cli.main(["--dataset", "digits", "--kvstore", "none", "--gpus", "3"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == cli.EXIT_USAGE
    assert len(lines) == 1 and lines[0].startswith("hvdtrain: error: --gpus asks for GPU 3 ")


def test_nvidia_smi_answer_is_parsed(monkeypatch):
    answer = ("NVIDIA A100-SXM4-80GB, 8.0\nNVIDIA H100 80GB HBM3, 9.0\n"
              "Tesla K80, [Not Supported]\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, answer, ""))
    assert gpus._read_from_nvidia_smi() == [
        gpus.Gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0)), gpus.Gpu(1, "NVIDIA H100 80GB HBM3", (9, 0))]


def test_no_driver_means_no_gpus(monkeypatch):
    def missing(*args, **kwargs):
        raise OSError("not found")
    monkeypatch.setattr(gpus.ctypes, "CDLL", missing)
    monkeypatch.setattr(subprocess, "run", missing)
    assert gpus.read_gpus() == []


def test_deployment_page_states_the_supported_range():
    text = " ".join(open(os.path.join(REPO, "docs", "deployment.md")).read().split())
    low, high = gpus.SUPPORTED_RANGE.split("-")
    assert f"compute capability {low} to {high}" in text
    assert f"runs on compute capability {gpus.SUPPORTED_RANGE} only" in text
