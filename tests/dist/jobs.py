"""Launching real multi-process jobs on this host."""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from helpers import assert_arrays_close, record_job, run_command, tool

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_TIMEOUT = 240


def launcher(name, np_=2):
    """The command prefix that starts `np_` local processes with launcher `name`."""
    if name == "horovodrun":
        return [tool("horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}"]
    if name == "horovodrun-gloo":
        return [tool("horovodrun"), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}"]
    if name == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--tag-output",
                "-np", str(np_), "-x", "PATH"]
    raise ValueError(name)


LAUNCHERS = ["horovodrun", "horovodrun-gloo", "mpirun"]


def run_ranks(prefix, out_dir, flags, timeout=JOB_TIMEOUT, env=None):
    """Run rank_worker.py under `prefix` (a launcher, or [] for one plain process);
    return the per-rank JSON results and parameter arrays, ordered by rank."""
    cmd = list(prefix) + [sys.executable, os.path.join(HERE, "rank_worker.py"), str(out_dir)]
    proc = run_command(cmd + list(flags), timeout=timeout, env=env)
    assert proc.returncode == 0
    results = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out_dir, "rank*.json")))]
    params = [dict(np.load(os.path.join(out_dir, f"rank{r['rank']}.npz"))) for r in results]
    assert params
    return results, params, proc.stdout


def assert_same_params(a, b, tol=0.0):
    """Same array names, each array within `tol` per unit of magnitude
    (:func:`helpers.assert_arrays_close`; 0: bit-identical)."""
    assert sorted(a) == sorted(b)
    for key in a:
        assert_arrays_close(a[key], b[key], tol, what=key)

DIGITS = ["--dataset", "digits", "--no-cuda", "--log-interval", "0"]


def tagged_pids(tag):
    """Pids of live processes whose environment or command line carries `tag`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env, \
                    open(f"/proc/{entry}/cmdline", "rb") as cmd:
                blob = env.read() + cmd.read()
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if tag.encode() in blob:
            pids.append(int(entry))
    return pids


def role_pids(tag, role):
    """Tagged pids whose environment has DMLC_ROLE=`role` (the role's own process)."""
    out = []
    for pid in tagged_pids(tag):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if f"DMLC_ROLE={role}".encode() in env and b"remote.py" not in cmd:
            out.append(pid)
    return out


def rank_pids(tag):
    """{rank: pid} of tagged training processes (a Python running hvdtrain) started by
    horovodrun or mpirun, from the rank variable the launcher gave them."""
    found = {}
    for pid in tagged_pids(tag):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = dict(kv.split(b"=", 1) for kv in
                       open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if len(argv) < 2 or b"python" not in argv[0] or not argv[1].endswith(b"hvdtrain"):
            continue
        rank = env.get(b"HOROVOD_RANK") or env.get(b"OMPI_COMM_WORLD_RANK")
        if rank is not None:
            found[int(rank)] = pid
    return found


def tagged_launch(cmd, tag, record=True):
    """Start a launcher whose processes all carry HVDTRAIN_TEST_TAG=`tag`.

    Its output goes to a file (``proc.log_path``), not a pipe: a job the test waits on
    cannot block on a full pipe, and the failure report (helpers.job_report) can read what
    it said so far at any moment. A job a module fixture starts for a later test is not
    recorded here (``record=False``): that test records it (``record_job(cmd,
    path=proc.log_path)``), so the report and the log's removal are its own."""
    env = dict(os.environ, HVDTRAIN_TEST_TAG=tag)
    log = tempfile.NamedTemporaryFile(prefix="hvdtrain-job-", suffix=".log", delete=False)
    with log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    proc.log_path = log.name
    proc.cmd = cmd
    if record:
        record_job(cmd, path=log.name)
    return proc


def job_log(proc):
    """What a job started by :func:`tagged_launch` has written so far."""
    with open(proc.log_path, errors="replace") as src:
        return src.read()


def reap(proc, tag, timeout):
    """Wait up to `timeout` s for the launcher, then check that no tagged process is left.

    A launcher still running is a failure: it and every tagged process are killed."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        kill_tagged(tag)
        proc.wait()
        pytest.fail(f"launcher still running after {timeout}s")
    # A bound, not a measurement: a rank on a busy machine may take seconds to exit.
    deadline = time.monotonic() + 30
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = kill_tagged(tag)
    assert survivors == [], "processes of the job survived it"
    return job_log(proc)


def kill_tagged(tag):
    """SIGKILL every live process carrying `tag`; return their pids."""
    pids = tagged_pids(tag)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
