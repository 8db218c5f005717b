"""Launching real multi-process jobs on this host."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

from helpers import JOB_PROCESS_GROUP, assert_arrays_close, record_job, run_command, tool

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_TIMEOUT = 240


def launcher(name, np_=2):
    """The command prefix that starts `np_` local processes with launcher `name`.

    ``"ranks"`` is for a test that is not about the launcher: mpirun, which starts the ranks
    at once, where horovodrun spends 2 s of a core on every job first (it imports each
    framework's extension in a child process to check its build). The launchers themselves
    are tested by the tests parametrized over LAUNCHERS and by the documented lines."""
    if name == "ranks":  # more ranks than cores too, as horovodrun -H localhost:N allows
        mpirun = launcher("mpirun", np_)
        return mpirun[:1] + ["--oversubscribe"] + mpirun[1:]
    if name == "horovodrun":
        return [tool("horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}"]
    if name == "horovodrun-gloo":
        return [tool("horovodrun"), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}"]
    if name == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--tag-output",
                "-np", str(np_), "-x", "PATH"]
    if name == "horovodrun-elastic":  # Horovod's elastic driver, on this host alone
        return [tool("horovodrun"), "--gloo", "-np", str(np_), "--min-np", str(np_),
                "--max-np", str(np_), "--network-interface", "lo",
                "--host-discovery-script", _discovery_script(np_)]
    raise ValueError(name)


def _discovery_script(slots):
    """A host discovery script naming this host with `slots` slots (one per process)."""
    path = os.path.join(tempfile.gettempdir(), f"hvdtrain-test-discover-{slots}.sh")
    if not os.path.isfile(path):
        with open(path + ".tmp", "w") as out:
            out.write(f"#!/bin/sh\necho localhost:{slots}\n")
        os.chmod(path + ".tmp", 0o755)
        os.replace(path + ".tmp", path)
    return path


LAUNCHERS = ["horovodrun", "horovodrun-gloo", "mpirun"]


def run_ranks(prefix, out_dir, flags, timeout=JOB_TIMEOUT, env=None):
    """Run rank_worker.py under `prefix` (a launcher, or [] for one plain process);
    return the per-rank JSON results and parameter arrays, ordered by rank."""
    cmd = list(prefix) + [sys.executable, os.path.join(HERE, "rank_worker.py"), str(out_dir)]
    proc = run_command(cmd + list(flags), timeout=timeout, env=env)
    assert proc.returncode == 0
    # rank<R>.json only: HVDTRAIN_DUMP_EPOCHS also writes rank<R>-exchanged.json.
    results = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out_dir, "rank*.json")))
               if re.fullmatch(r"rank\d+\.json", os.path.basename(p))]
    params = [dict(np.load(os.path.join(out_dir, f"rank{r['rank']}.npz"))) for r in results]
    assert params
    return results, params, proc.stdout


def assert_same_params(a, b, tol=0.0):
    """Same array names, each array within `tol` per unit of magnitude
    (:func:`helpers.assert_arrays_close`; 0: bit-identical)."""
    assert sorted(a) == sorted(b)
    for key in a:
        assert_arrays_close(a[key], b[key], tol, what=key)

# A resumed run's running statistics start from their average over the ranks at the stop (a
# checkpoint holds one copy), where the run that never stopped averages them at the next
# epoch's end. Averaging is linear, as their updates are: the two agree in exact arithmetic,
# and in float32 within a few roundings, in units of the last place of the array's largest
# value (an element near zero is the difference of larger ones: its own last place says
# nothing of the arithmetic). Measured: 5 units, bn_cnn, 2 ranks, 19 steps after the stop.
# The trained weights, which no statistic reaches in training mode, are bit-identical.
STATISTICS_ULPS = 16


def is_statistic(name):
    """Whether array `name` (as rank_worker.py names them) is a BatchNorm running statistic,
    of the model or of its --ema average."""
    return name.rsplit(".", 1)[-1].split("@")[0] in ("running_mean", "running_var")


def assert_same_model(expected, got, statistics_ulps=STATISTICS_ULPS):
    """`got` (a resumed run's arrays) is `expected` (the run that never stopped): every
    trained array bit-identical, each running statistic within `statistics_ulps` float32
    units in the last place of its largest value (see STATISTICS_ULPS)."""
    assert sorted(expected) == sorted(got)
    for key in sorted(expected, key=is_statistic):  # the exact ones first
        if not is_statistic(key):
            assert_arrays_close(got[key], expected[key], 0, what=key)
            continue
        want = np.asarray(expected[key], np.float32)
        unit = np.spacing(np.abs(want).max())
        ulps = np.abs(np.asarray(got[key], np.float64) - want) / unit
        assert ulps.max() <= statistics_ulps, \
            f"{key}: {int((ulps > statistics_ulps).sum())} of {ulps.size} elements more than " \
            f"{statistics_ulps} units in the last place of {np.abs(want).max():g} apart " \
            f"(worst {ulps.max():.1f})"


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


def _thread_cpu_seconds(pids):
    """{(pid, thread id): CPU seconds so far} of every thread of `pids` still alive."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            seconds[(pid, int(task))] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def lower_priority_of_busy_threads(tag, settle_s=1.0, sample_s=1.0, busy=0.2):
    """Give the lowest CPU priority (nice 19) to the threads of the tagged processes that
    stay busy while their job waits: after `settle_s` (for the ranks to reach the collective
    they will wait in), those that used more than `busy` of a core over `sample_s`. (A
    spinning thread gets less than a whole core when the machine is busy; a waiting one uses
    next to nothing.)

    For a job left waiting on purpose (a frozen rank, a rank 0 that pauses): Horovod's
    background thread does not sleep while its rank waits for a peer; it spins in the
    controller's collectives. Measured 2026-12-02 on this 2-core VM: 8.6 s of CPU in 10 s
    on the rank beside a SIGSTOPped one (MPI); in an 8 s pause, 6.4 s under MPI and 2.4 s
    under Gloo. Left alone, such a job takes most of a core from the tests running beside
    it. Only the busy threads are lowered: the waiting rank's watchdog and pulse threads,
    which must still act on time, keep their priority. (Niceness is per thread on Linux.)
    Returns the (pid, thread id) pairs lowered."""
    time.sleep(settle_s)
    pids = tagged_pids(tag)
    before = _thread_cpu_seconds(pids)
    time.sleep(sample_s)
    after = _thread_cpu_seconds(pids)
    lowered = []
    for key, used in after.items():
        if key in before and used - before[key] > busy * sample_s:
            try:
                os.setpriority(os.PRIO_PROCESS, key[1], 19)
                lowered.append(key)
            except OSError:
                pass  # the thread has ended
    return lowered


def lower_priority_of_busy_threads_soon(tag):
    """:func:`lower_priority_of_busy_threads` in a thread, so that the caller can go on
    (start the next job) while it samples; the list it returns fills with the (pid, thread
    id) pairs lowered, within two seconds."""
    lowered = []
    threading.Thread(target=lambda: lowered.extend(lower_priority_of_busy_threads(tag)),
                     daemon=True).start()
    return lowered


def parent_pid(pid):
    """The parent of process `pid`, from /proc (OSError when it is gone)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def role_pids(tag, role):
    """Tagged pids whose environment has DMLC_ROLE=`role` (the role's own process: not the ssh
    relay, and not a child a worker starts, which inherits its environment for a moment)."""
    found = {}
    for pid in tagged_pids(tag):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            ppid = parent_pid(pid)
        except (OSError, IndexError, ValueError):
            continue
        if f"DMLC_ROLE={role}".encode() in env and b"remote.py" not in cmd:
            found[pid] = ppid
    return [pid for pid, ppid in found.items() if ppid not in found]


def rank_pids(tag, program="hvdtrain"):
    """{rank: pid} of tagged training processes (a Python running `program`, by default
    hvdtrain) started by horovodrun or mpirun, from the rank variable the launcher gave them."""
    found = {}
    for pid in tagged_pids(tag):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = dict(kv.split(b"=", 1) for kv in
                       open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if len(argv) < 2 or b"python" not in argv[0] or not argv[1].endswith(program.encode()):
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
                                **JOB_PROCESS_GROUP)
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
    named = {pid: _command_line(pid) for pid in tagged_pids(tag)}
    survivors = kill_tagged(tag)
    assert survivors == [], ("processes of the job survived it: "
                             + "; ".join(f"{pid} {named.get(pid, '?')}" for pid in survivors))
    return job_log(proc)


def _command_line(pid):
    """Process `pid`'s command line with its parent, for a failure's message."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmd:
            words = cmd.read().replace(b"\0", b" ").decode(errors="replace").strip()
        return f"(parent {parent_pid(pid)}): {words}"
    except (OSError, IndexError, ValueError):
        return "(gone)"


def kill_tagged(tag):
    """SIGKILL every live process carrying `tag`; return their pids."""
    pids = tagged_pids(tag)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
