"""scripts/install-deps.sh from the environment the GPU image starts with: a venv whose pip
is 20.0.2 (Ubuntu 20.04's), which cannot install a pyproject.toml project in editable mode.

It runs the script the way the Dockerfile does: first the cached Horovod layer
(``--deps-only``) from a folder holding only the files the Dockerfile copies before that
step, then the whole script from the checkout, as a developer and CI run it.
"""
import glob
import os
import shutil
import subprocess
import sys

import pytest

import dockerfile
from helpers import REPO, run_command


def _cached_horovod_wheel():
    cache = os.environ.get("HVDTRAIN_WHEEL_CACHE",
                           os.path.expanduser("~/.cache/hvdtrain/wheels"))
    tag = "cpu-py%d%d" % sys.version_info[:2]
    return glob.glob(os.path.join(cache, tag, "horovod-0.28.1-*.whl"))


def _docker_context_before_the_heavy_step(folder):
    """Copy into `folder` what the Dockerfile's build stage copies before install-deps.sh."""
    build = dockerfile.stages(os.path.join(REPO, "Dockerfile"))[0]
    heavy = dockerfile.step_running(build, "scripts/install-deps.sh")
    for keyword, args in build.instructions[:heavy]:
        if keyword != "COPY":
            continue
        sources, dest, _ = dockerfile.copy_sources(args)
        target = folder / dest
        target.mkdir(parents=True, exist_ok=True)
        for source in sources:
            shutil.copy(os.path.join(REPO, source), target)


# pip byte-compiles every module it installs (MXNet's thousands among them): seconds of a
# core that tell nothing about the script; the image's and a developer's installs compile.
# Installs here build with setuptools' own distutils, as a user's do (tests/conftest.py
# chooses the standard library's for the suite's own processes).
NO_COMPILE = {"PIP_NO_COMPILE": "1", "SETUPTOOLS_USE_DISTUTILS": "local"}


def _python(venv, code, cwd):
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, timeout=300, cwd=str(cwd))


@pytest.mark.slow
def test_install_deps_from_a_pip_20_venv_as_the_image_does(tmp_path):
    if not _cached_horovod_wheel():
        pytest.skip("no cached Horovod wheel (run `make install` first); building one here "
                    "would take too long")
    venv = tmp_path / "venv"
    as_a_user = dict(os.environ, **NO_COMPILE)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300,
                   env=as_a_user)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "pip==20.0.2"],
                   check=True, timeout=300, env=as_a_user)
    old = _python(venv, "import pip; print(pip.__version__)", tmp_path)
    assert old.stdout.strip() == "20.0.2", old.stdout + old.stderr

    # 1. The image's Horovod layer: only the install script and the package metadata.
    context = tmp_path / "context"
    _docker_context_before_the_heavy_step(context)
    proc = run_command(["bash", str(context / "scripts" / "install-deps.sh"), "--no-apt",
                        "--deps-only", "--extras", "test,demo", "--venv", str(venv)],
                       timeout=1800, cwd=str(context), env=NO_COMPILE)
    assert proc.returncode == 0, proc.stdout[-4000:]
    deps = _python(venv, "import pip, horovod.mxnet, matplotlib, tqdm; print(pip.__version__)",
                   tmp_path)
    assert deps.returncode == 0, deps.stderr
    # No scikit-learn (the digits are bundled): MXNet imports it, and SciPy with it, in
    # every process when it is installed.
    assert _python(venv, "import sklearn", tmp_path).returncode != 0, \
        "scikit-learn was installed"
    assert int(deps.stdout.split(".")[0]) >= 21, "pip was not upgraded"
    assert _python(venv, "import hvdtrain", tmp_path).returncode != 0, \
        "--deps-only installed hvdtrain itself"

    # 2. The whole script from the checkout: hvdtrain, editable, on top.
    proc = run_command(["bash", os.path.join(REPO, "scripts", "install-deps.sh"), "--no-apt",
                        "--venv", str(venv)], timeout=1800, env=NO_COMPILE)
    assert proc.returncode == 0, proc.stdout[-4000:]
    probe = _python(venv, "import os, hvdtrain; print(os.path.dirname(hvdtrain.__file__))",
                    tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert os.path.samefile(probe.stdout.strip(), os.path.join(REPO, "hvdtrain"))
    cli = subprocess.run([str(venv / "bin" / "hvdtrain"), "--help"], capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode == 0 and "--no-progress" in cli.stdout, cli.stderr
    digits = _python(venv, "from hvdtrain.data.datasets import load_digits; "
                           "print(len(load_digits().train_y))", tmp_path)
    assert digits.stdout.strip() == "1437", digits.stderr
