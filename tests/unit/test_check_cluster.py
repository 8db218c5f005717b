"""check-cluster's per-host report: CUDA, NCCL, GPU count and each GPU's compute capability.

The probe runs for real here (CPU builds, no GPU); GPU hosts are faked by their probe answer,
as ssh would bring it back.
"""
import json
import subprocess
import sys

from hvdtrain.check import cluster
from hvdtrain.store.gpus import SUPPORTED_RANGE

LOCAL = {"python": sys.executable, "hvdtrain": "0.1.0", "hvdtrain_path": "/opt/hvdtrain/hvdtrain",
         "mxnet": "1.9.1", "horovod": "0.28.1", "cuda": True, "nccl": True, "gpus": 2,
         "gpu_list": [[0, "NVIDIA A100-SXM4-40GB", "8.0", True],
                      [1, "NVIDIA A100-SXM4-40GB", "8.0", True]],
         "hvd_init": "ok"}


def _answer(monkeypatch, **changes):
    found = dict(LOCAL, **changes)
    line = "HVDTRAIN-PROBE " + json.dumps(found)
    monkeypatch.setattr(cluster.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, line + "\n", ""))


def test_probe_reports_cuda_nccl_and_gpus_of_this_machine():
    proc = subprocess.run(cluster.probe_command(sys.executable), capture_output=True, text=True,
                          timeout=300)
    found = cluster.parse_probe(proc.stdout)
    assert found.get("hvd_init") == "ok", proc.stdout + proc.stderr
    assert (found["cuda"], found["nccl"], found["gpus"], found["gpu_list"]) == \
        (False, False, 0, [])


def test_a_supported_gpu_host_is_ready(monkeypatch):
    _answer(monkeypatch)
    row = cluster.check_host("d1", LOCAL)
    assert row["status"] == "ok"
    assert (row["CUDA"], row["NCCL"], row["GPUs"], row["capability"]) == \
        ("yes", "yes", "2", "8.0,8.0")
    cells = cluster.format_table([row]).splitlines()[1].split()
    assert cells[0] == "d1" and cells[5] == "ok" and cells[-1] == "ok"
    assert cluster.format_gpus([row]).splitlines() == [
        "d1  GPU 0: NVIDIA A100-SXM4-40GB, compute capability 8.0",
        "d1  GPU 1: NVIDIA A100-SXM4-40GB, compute capability 8.0"]


def test_a_hopper_host_fails_naming_the_gpu_and_the_range(monkeypatch):
    _answer(monkeypatch, gpus=1, gpu_list=[[0, "NVIDIA H100 80GB HBM3", "9.0", False]])
    row = cluster.check_host("d2", LOCAL)
    assert row["status"] == (f"FAIL: GPU 0 (NVIDIA H100 80GB HBM3) has compute capability 9.0, "
                             f"outside {SUPPORTED_RANGE}")
    assert row["capability"] == "9.0"
    assert "(unsupported: mxnet-cu112 runs on" in cluster.format_gpus([row])


def test_a_host_without_nccl_or_cuda_fails(monkeypatch):
    _answer(monkeypatch, nccl=False, cuda=False, gpus=0, gpu_list=[])
    row = cluster.check_host("d3", LOCAL)
    assert (row["CUDA"], row["NCCL"], row["capability"]) == ("no", "no", "-")
    assert "CUDA in MXNet: no here, yes locally" in row["status"]
    assert "NCCL in Horovod: no here, yes locally" in row["status"]
