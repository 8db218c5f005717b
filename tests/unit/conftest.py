"""Fixtures shared by the resume tests (test_resume_rules.py, test_run_dir.py)."""
import shutil

import pytest

from helpers import run_command, tool

QUICK = ["--dataset", "digits", "--no-cuda", "--kvstore", "none", "--log-interval", "0"]


@pytest.fixture(scope="session")
def two_epochs(tmp_path_factory):
    """An output folder holding checkpoints epoch-0001 and epoch-0002 of a finished run
    (made by the `hvdtrain` command; a digits epoch takes well under a second)."""
    run = tmp_path_factory.mktemp("run")
    proc = run_command([tool("hvdtrain"), *QUICK, "--epochs", "2", "--output-dir", str(run)],
                       timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return run


@pytest.fixture
def run_copy(two_epochs, tmp_path):
    """A copy of `two_epochs` a test may change."""
    copy = tmp_path / "run"
    shutil.copytree(two_epochs, copy)
    return copy
