"""scripts/check_build.py, which install-deps.sh (and the image's build) runs after installing.

This machine has the CPU builds: the plain check passes, and --gpu must name both things a
GPU host needs that they lack. Only an image build shows the --gpu check passing.
"""
import importlib.util
import os
import subprocess
import sys

from helpers import REPO

SCRIPT = os.path.join(REPO, "scripts", "check_build.py")


def _run(*flags):
    return subprocess.run([sys.executable, SCRIPT, *flags], capture_output=True, text=True,
                          timeout=300)


def test_cpu_build_passes_the_plain_check(capfd):
    """In this process (the script's main): the test below,
    test_gpu_check_names_missing_cuda_and_nccl_one_line_each, runs the script as a real
    process and checks its whole output."""
    spec = importlib.util.spec_from_file_location("check_build", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    capfd.readouterr()
    code = script.main([])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert out.startswith("check_build: ok: mxnet 1.9.1 (CUDA off), horovod 0.28.1"), out


def test_gpu_check_names_missing_cuda_and_nccl_one_line_each():
    proc = _run("--gpu")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines == [
        "check_build: MXNet 1.9.1 is built without CUDA: install mxnet-cu112, not mxnet",
        "check_build: Horovod is built without NCCL (HOROVOD_GPU_OPERATIONS=NCCL)"], proc.stderr
