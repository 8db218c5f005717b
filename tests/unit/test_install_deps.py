"""scripts/install-deps.sh from the environment the GPU image starts with: a venv whose pip
is 20.0.2 (Ubuntu 20.04's), which cannot install a pyproject.toml project in editable mode."""
import glob
import os
import subprocess
import sys

import pytest

from helpers import REPO, run_command


def _cached_horovod_wheel():
    cache = os.environ.get("HVDTRAIN_WHEEL_CACHE",
                           os.path.expanduser("~/.cache/hvdtrain/wheels"))
    tag = "cpu-py%d%d" % sys.version_info[:2]
    return glob.glob(os.path.join(cache, tag, "horovod-0.28.1-*.whl"))


@pytest.mark.slow
def test_install_deps_works_from_a_pip_20_venv(tmp_path):
    if not _cached_horovod_wheel():
        pytest.skip("no cached Horovod wheel (run `make install` first); building one here "
                    "would take too long")
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([python, "-m", "pip", "install", "-q", "pip==20.0.2"], check=True,
                   timeout=300)
    old = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True)
    assert old.stdout.startswith("pip 20.0.2 "), old.stdout

    proc = run_command(["bash", os.path.join(REPO, "scripts", "install-deps.sh"), "--no-apt",
                        "--venv", str(venv)], timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:]

    probe = subprocess.run(
        [python, "-c", "import os, pip, hvdtrain, horovod.mxnet; "
                       "print(pip.__version__, os.path.dirname(hvdtrain.__file__))"],
        capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    pip_version, package_dir = probe.stdout.split()
    assert int(pip_version.split(".")[0]) >= 21, "pip was not upgraded"
    # Editable: the venv runs this checkout's sources.
    assert os.path.samefile(package_dir, os.path.join(REPO, "hvdtrain"))
    cli = subprocess.run([str(venv / "bin" / "hvdtrain"), "--help"], capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode == 0 and "--no-progress" in cli.stdout, cli.stderr
