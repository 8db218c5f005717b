"""MXNet's parameter server through hvdtrain-launch: local, ssh (loopback hosts) and mpi."""
import os
import shlex
import signal
import sys
import time
import uuid

import pytest

from helpers import run_command, tool
from jobs import (DIGITS, JOB_TIMEOUT, assert_same_params, kill_tagged, launcher, parent_pid,
                  reap, role_pids, run_ranks, tagged_launch, tagged_pids)
from loopback_hosts import loopback_hosts

pytestmark = pytest.mark.dist
HERE = os.path.dirname(os.path.abspath(__file__))


def ps_launch(*options):
    return [tool("hvdtrain-launch")] + list(options)


@pytest.mark.parametrize("how,servers", [("mpi", 1), ("local", 2)], ids=["mpi-1", "local-2"])
def test_digits_on_dist_sync(how, servers, tmp_path):
    """Also the test of ``--launcher mpi`` on one host (formerly
    test_mpi_launcher_on_one_host, a job of its own): the local launcher's one-server job is
    run by test_dist_async_learns and test_worker_that_raises_stops_the_job."""
    results, params, out = run_ranks(
        ps_launch("-n", "2", "-s", str(servers), "--launcher", how), tmp_path,
        DIGITS + ["--kvstore", "dist_sync", "--epochs", "10", "--lr", "0.05"])
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["num_workers"] for r in results] == [2, 2]
    assert results[0]["test_acc"] >= 0.95, out[-3000:]
    assert results[0]["test_acc"] == results[1]["test_acc"]
    assert results[0]["test_count"] == results[1]["test_count"] == 360
    assert_same_params(params[0], params[1])
    info = [l for l in out.splitlines() if " INFO " in l]
    # Only workers log; under mpi each rank picked its role (remote.py) and says it.
    assert info and all(l.startswith("[worker ") for l in info), out[-3000:]


def test_dist_sync_matches_horovod(tmp_path):
    flags = DIGITS + ["--model", "simple_cnn", "--max-steps", "5", "--lr", "0.1",
                      "--batch-size", "16"]
    (tmp_path / "ps").mkdir()
    (tmp_path / "hvd").mkdir()
    _, ps, _ = run_ranks(ps_launch("-n", "2", "-s", "2"), tmp_path / "ps",
                         flags + ["--kvstore", "dist_sync"])
    _, hvd, _ = run_ranks(launcher("ranks"), tmp_path / "hvd",
                          flags + ["--kvstore", "horovod"])
    assert_same_params(ps[0], hvd[0], tol=1e-5)
    assert_same_params(ps[1], hvd[1], tol=1e-5)


def test_dist_async_learns(tmp_path):
    results, _, out = run_ranks(ps_launch("-n", "2", "-s", "1"), tmp_path,
                                DIGITS + ["--kvstore", "dist_async", "--epochs", "8"])
    assert len(results) == 2
    assert all(r["test_count"] == 360 for r in results)  # each scores the whole test set
    assert results[0]["test_acc"] >= 0.9, out[-3000:]


def test_worker_that_raises_stops_the_job(tmp_path):
    tag = uuid.uuid4().hex
    start = time.monotonic()
    proc = tagged_launch(ps_launch("-n", "2", "-s", "1", "--env", "HVDTRAIN_TEST_TAG",
                                   "--env-worker", "HVDTRAIN_FAULT:raise",
                                   "--env-worker", "HVDTRAIN_FAULT_RANK:1", sys.executable,
                                   os.path.join(HERE, "failing_worker.py"), "--kvstore",
                                   "dist_sync", *DIGITS, "--epochs", "3"), tag)
    seen = set()
    # The job must end by itself: the bound is generous (a busy 2-core machine), the
    # failure is a job still running after it.
    while proc.poll() is None and time.monotonic() - start < 120:
        seen.update(tagged_pids(tag))
        time.sleep(0.2)
    out = reap(proc, tag, timeout=5)
    assert proc.returncode != 0
    assert "injected failure on rank" in out
    assert len(seen) >= 4  # scheduler, server, two workers


APPORT_LIKE = (  # a site-wide sitecustomize replacing sys.excepthook as Ubuntu's apport does
    "import sys\n"
    "def _report(exc_type, exc, tb):\n"
    "    print('apport-like hook:', exc_type.__name__, flush=True)\n"
    "    sys.__excepthook__(exc_type, exc, tb)\n"
    "sys.excepthook = _report\n")


# Without a sitecustomize, a program run as an argv (what the cases below start) is covered by
# test_a_quoted_command_runs_as_launch_py_runs_it_and_a_failure_ends_the_job: its
# "assignment" (raise, 1) and "assignment-passes" (success, both workers done) cases are
# such argvs once command.py has split off the NAME=value words, with the same claims and
# more; the plain (exit, 3) case is local-exit-3-True below, whose sitecustomize replaces
# only sys.excepthook, which sys.exit never reaches.
@pytest.mark.parametrize("how,fail,status,site", [
    ("mpi", "exit", 3, False), ("local", "raise", 1, True), ("local", "exit", 3, True)])
def test_any_python_worker_program_that_fails_ends_the_job(how, fail, status, site, tmp_path,
                                                           monkeypatch):
    # MXNet alone, no hvdtrain: worker 1 raises or calls sys.exit(3) while worker 0 waits
    # for it in a pushpull. Left to itself it hangs in ps-lite's finalizer (an exit barrier);
    # a hang never ends, so the bound is reap's timeout, generous for start-up under load.
    if site:
        (tmp_path / "sitecustomize.py").write_text(APPORT_LIKE)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    tag = uuid.uuid4().hex
    proc = tagged_launch(ps_launch("--launcher", how, "-n", "2", "-s", "1",
                                   "--env", "HVDTRAIN_TEST_TAG",
                                   "--env-worker", f"PS_PROGRAM_FAIL:{fail}", sys.executable,
                                   os.path.join(HERE, "ps_program.py")), tag)
    out = reap(proc, tag, timeout=120)  # a hang fails here
    assert proc.returncode == status, out[-3000:]
    if status:
        assert f"exited with status {status}; stopping the job" in out
    else:
        assert out.count("done: [2.0, 2.0, 2.0, 2.0]") == 2, out[-3000:]
    if site and fail == "raise":
        assert "apport-like hook: RuntimeError" in out, out[-3000:]


@pytest.mark.parametrize("shell", [False, True], ids=["program", "shell-command"])
@pytest.mark.parametrize("role", ["server", "worker"])
def test_a_killed_remote_py_takes_its_process_with_it(role, shell, monkeypatch):
    """mpirun SIGKILLs a rank that has not ended 1 s after its TERM; a ``remote.py`` starved of
    CPU that long died before its handler killed the role's process, which runs in a session
    of its own and was left behind (a server waits forever; seen once under load in CI-like
    runs). Here one role's remote.py is SIGKILLed outright: the kernel ends its process too
    (PR_SET_PDEATHSIG), with a shell command the shell and its programs as well, and mpirun
    stops the rest of the job."""
    monkeypatch.setenv("PS_PROGRAM_STEPS", "100000")  # it runs until the kill ends it
    program = [sys.executable, os.path.join(HERE, "ps_program.py")]
    command = [shlex.join(program) + "; echo went-on"] if shell else program
    tag = uuid.uuid4().hex
    proc = tagged_launch(ps_launch("--launcher", "mpi", "-n", "2", "-s", "1",
                                   "--env", "HVDTRAIN_TEST_TAG", "--env", "PS_PROGRAM_STEPS",
                                   *command), tag)
    deadline = time.monotonic() + 120  # a bound for a busy machine, not a measurement
    while len(role_pids(tag, "worker")) < 2 or not role_pids(tag, "server"):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_tagged(tag)
            pytest.fail(f"the job did not start (launcher: {proc.poll()})")
        time.sleep(0.2)
    victim = role_pids(tag, role)[0]
    remote = parent_pid(victim)
    assert b"remote.py" in open(f"/proc/{remote}/cmdline", "rb").read()
    os.kill(remote, signal.SIGKILL)
    out = reap(proc, tag, timeout=60)  # a survivor fails here
    assert proc.returncode != 0, out[-2000:]


def test_killed_worker_stops_the_job(tmp_path):
    tag = uuid.uuid4().hex
    proc = tagged_launch(ps_launch("-n", "2", "-s", "2", "--env", "HVDTRAIN_TEST_TAG",
                                   tool("hvdtrain"), "--kvstore", "dist_sync", *DIGITS,
                                   "--epochs", "500", "--output-dir", str(tmp_path)), tag)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 180  # a bound for a busy machine, not a measurement
    # Training has got going once worker 0 has recorded an epoch.
    while not (metrics.exists() and '"event": "epoch"' in metrics.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_tagged(tag)
            pytest.fail(f"no epoch finished (launcher: {proc.poll()})")
        time.sleep(0.2)
    os.kill(role_pids(tag, "worker")[1], signal.SIGKILL)
    out = reap(proc, tag, timeout=60)  # a job that does not end fails here
    assert proc.returncode == 128 + signal.SIGKILL, out[-2000:]


def test_ssh_launcher_over_two_loopback_hosts(tmp_path):
    with loopback_hosts(tmp_path) as hosts:
        hostfile = hosts.hostfile(slots=1)
        (tmp_path / "out").mkdir()
        results, params, out = run_ranks(
            ps_launch("-n", "2", "-s", "2", "-H", hostfile, "--launcher", "ssh",
                      "-p", str(hosts.port), "-i", hosts.key),
            tmp_path / "out", DIGITS + ["--kvstore", "dist_sync", "--epochs", "10",
                                        "--lr", "0.05"])
    assert results[0]["test_acc"] >= 0.95 and results[0]["test_acc"] == results[1]["test_acc"]
    assert_same_params(params[0], params[1])
    # One worker on each loopback host.
    assert sorted(r["ssh_connection"].split()[2] for r in results) == hosts.addresses


@pytest.mark.parametrize("argv,needle", [
    (["-n", "0", "true"], "at least 1"), (["-n", "1"], "no worker command"),
    (["-n", "1", "-H", "{bad}", "true"], "hosts:1: cannot read"),
    (["-n", "1", "--launcher", "ssh", "true"], "needs --hostfile")])
def test_launcher_bad_input_is_one_line(argv, needle, tmp_path, capfd):
    # In this process: the launcher's main() refuses before anything starts. That the console
    # script turns main()'s 2 into its exit status with that line alone is shown by a real
    # process in test_mistyped_worker_command_is_one_line_and_leaves_nothing.
    from hvdtrain.launch.launcher import main
    bad = tmp_path / "hosts"
    bad.write_text("d1 slots=four\n")
    assert main([a.format(bad=bad) for a in argv]) == 2
    out, err = capfd.readouterr()
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain-launch: error: ") \
        and needle in lines[0], out + err


def test_sync_dst_dir_copies_the_folder_and_runs_there(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "marker.txt").write_text("synced")
    dest = tmp_path / "dest"
    code = ("import os, mxnet as mx; store = mx.kv.create('dist_sync'); "
            "print('cwd', os.getcwd(), open('marker.txt').read())")
    with loopback_hosts(tmp_path / "ssh") as hosts:
        proc = run_command(ps_launch("-n", "2", "-s", "1", "-H", hosts.hostfile(slots=1),
                                     "-p", str(hosts.port), "-i", hosts.key,
                                     "--sync-dst-dir", str(dest), sys.executable, "-c", code),
                           timeout=JOB_TIMEOUT, cwd=str(project))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.count(f"cwd {dest} synced") == 2
    assert (dest / "marker.txt").read_text() == "synced"


def test_mistyped_worker_command_is_one_line_and_leaves_nothing():
    # Local only: the command is checked before the launcher kind matters (launcher.main's
    # check_command; mpi without a hostfile checks it just as local does, and nothing starts
    # before it), which tests/unit/test_launch.py's
    # test_a_mistyped_worker_command_is_refused_before_anything_starts shows for mpi in-process.
    tag = uuid.uuid4().hex
    proc = tagged_launch(ps_launch("-n", "2", "-s", "1", "--launcher", "local",
                                   "--env", "HVDTRAIN_TEST_TAG", "hvdtrian", "--kvstore",
                                   "dist_sync", *DIGITS), tag)
    out = reap(proc, tag, timeout=60)  # also: no scheduler or server is left
    lines = [l for l in out.splitlines() if l.strip()]
    assert proc.returncode == 2, out
    assert lines == ["hvdtrain-launch: error: worker command 'hvdtrian' not found: it is not "
                     "on PATH (a typo?)"]


PS_PROGRAM = shlex.join([sys.executable, os.path.join(HERE, "ps_program.py")])


@pytest.mark.parametrize("command,status", [
    (f"PS_PROGRAM_FAIL=raise {PS_PROGRAM}", 1),  # launch.py's form with a variable
    (f"cd {shlex.quote(HERE)} && PS_PROGRAM_FAIL=exit {PS_PROGRAM}; echo went-on", 3),
    (f"PS_PROGRAM_FAIL=raise {PS_PROGRAM} | cat", 1),
    (f"PS_PROGRAM_NOTE='seen by the program' {PS_PROGRAM}", 0)],
    ids=["assignment", "and-then-semicolon", "pipe", "assignment-passes"])
def test_a_quoted_command_runs_as_launch_py_runs_it_and_a_failure_ends_the_job(command,
                                                                             status):
    # One quoted string, as MXNet's docs write it; launch.py runs it through bash. Without the
    # runner in the path, worker 1's failure hangs in ps-lite's finalizer (an exit barrier)
    # and the job never ends, so the bound is reap's timeout, generous for start-up under load.
    tag = uuid.uuid4().hex
    proc = tagged_launch(ps_launch("-n", "2", "-s", "1", "--env", "HVDTRAIN_TEST_TAG",
                                   command), tag)
    out = reap(proc, tag, timeout=180)  # a hang fails here; so does a process left behind
    assert proc.returncode == status, out[-3000:]
    lines = [l for l in out.splitlines() if l.startswith("hvdtrain-launch:")]
    if status:
        assert len(lines) == 1, out[-3000:]
        assert lines[0].endswith(f"exited with status {status}; stopping the job"), lines
        assert "went-on" not in out, out[-3000:]  # the shell went no further
    else:
        assert lines == [], out[-3000:]
        assert out.count("done: [2.0, 2.0, 2.0, 2.0]") == 2, out[-3000:]
        assert out.count("note: seen by the program") == 2, out[-3000:]
