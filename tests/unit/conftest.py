"""Fixtures shared by the resume tests (test_resume_rules.py, test_run_dir.py) and those of
starting from weights (test_start_weights*.py, test_finetune.py)."""
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


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    """Two small image folders (5 digits a class): classes digit0..digit4 and
    digit5..digit9."""
    from helpers import class_subset
    from hvdtrain.data.sample_images import write_digit_images
    root = tmp_path_factory.mktemp("five")
    write_digit_images(str(root / "all"), per_class=5)
    return tuple(class_subset(str(root / "all"), str(root / name),
                              [f"digit{d}" for d in digits])
                 for name, digits in (("low", range(5)), ("high", range(5, 10))))


@pytest.fixture
def start(monkeypatch, capfd):
    """``start(argv)``: run ``hvdtrain argv`` in this process (``cli.main``) up to its first
    step, where ``fit`` would begin; returns (exit status, output lines, the net's arrays by
    place at that point). ``start(argv, train=True)`` trains for real (to make a run to start
    from). ``start.lr_mult`` then holds each parameter's ``lr_mult``."""
    from hvdtrain.estimator import estimator
    from helpers import main_in_process
    held = {}

    def fit(parts):
        params = parts.net._collect_params_with_prefix()  # pylint: disable=protected-access
        held.update({place: p.data().asnumpy() for place, p in params.items()})
        run.lr_mult = {place: p.lr_mult for place, p in params.items()}
        return {"test_acc": None, "test_samples": 0, "total_time": 0.0, "steps": 0}

    real = estimator.run_fit

    def run(argv, train=False):
        held.clear()
        monkeypatch.setattr(estimator, "run_fit", real if train else fit)
        code, lines = main_in_process(argv, capfd)
        return code, lines, dict(held)
    return run
