"""The Python floor setup.cfg declares holds for the code and for the GPU image's Python."""
import configparser
import os
import re
import shutil
import subprocess
import sys

from helpers import REPO

# The Python each CUDA base image's Ubuntu release ships as python3.
UBUNTU_PYTHON = {"ubuntu18.04": (3, 6), "ubuntu20.04": (3, 8), "ubuntu22.04": (3, 10),
                 "ubuntu24.04": (3, 12)}


def declared_floor():
    """(major, minor) of ``python_requires = >=X.Y`` in setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", cfg["options"]["python_requires"].strip())
    assert match, "python_requires must read >=X.Y"
    return int(match.group(1)), int(match.group(2))


def test_code_runs_on_the_declared_floor():
    vermin = os.path.join(os.path.dirname(sys.executable), "vermin")
    vermin = vermin if os.path.exists(vermin) else shutil.which("vermin")
    assert vermin, "vermin is not installed: pip install -e '.[test]'"
    major, minor = declared_floor()
    # --eval-annotations: a module without `from __future__ import annotations` evaluates
    # `list[int]` when it is imported, which fails before 3.9.
    proc = subprocess.run([vermin, f"-t={major}.{minor}-", "--eval-annotations", "--violations",
                           "--no-tips", "hvdtrain", "scripts", "examples"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_docker_stage_python_meets_the_floor():
    text = open(os.path.join(REPO, "Dockerfile")).read()
    bases = re.findall(r"^FROM\s+nvidia/cuda:\S+-(ubuntu\d+\.\d+)", text, re.M)
    assert bases, "no nvidia/cuda base image found in the Dockerfile"
    for base in bases:
        assert UBUNTU_PYTHON[base] >= declared_floor(), \
            f"{base}'s python3 is {UBUNTU_PYTHON[base]}, below setup.cfg's python_requires"
