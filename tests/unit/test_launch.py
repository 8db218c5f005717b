import argparse
import os
import signal
import subprocess
import sys
import time

import pytest

from hvdtrain.config import ConfigError
from hvdtrain.launch import launcher as launcher_module
from hvdtrain.launch.hostfile import Host, HostfileError, parse_hosts, read_hostfile
from hvdtrain.launch.launcher import mpi_argv, parse_args, plan, remote_argv, scheduler_address
from hvdtrain.launch.remote import exit_status, mpi_role
from hvdtrain.launch.supervise import Job, Member


def test_hostfile_formats_and_comments():
    text = "# cluster\nd1 slots=4\nd2:2   # two GPUs\n\n10.0.0.3\nd4 slots=2 max_slots=2\n"
    assert parse_hosts(text) == [Host("d1", 4), Host("d2", 2), Host("10.0.0.3", 1),
                                 Host("d4", 2)]


@pytest.mark.parametrize("text,needle", [("d1 slots=four\n", "hf:1: cannot read"),
                                         ("ok\nd1:2 slots=3\n", "hf:2"),
                                         ("d1:0\n", "at least 1"),
                                         ("# nothing\n", "lists no hosts")])
def test_malformed_hostfiles_name_the_line(text, needle):
    with pytest.raises(HostfileError, match=needle):
        parse_hosts(text, "hf")


def test_missing_hostfile(tmp_path):
    with pytest.raises(HostfileError, match="cannot read hostfile"):
        read_hostfile(str(tmp_path / "nope"))


def test_parse_args_defaults():
    args = parse_args(["-n", "3", "hvdtrain", "--epochs", "1"])
    assert (args.num_servers, args.launcher, args.command) == (3, "local",
                                                               ["hvdtrain", "--epochs", "1"])
    assert parse_args(["-n", "1", "-H", "hf", "x"]).launcher == "ssh"
    with pytest.raises(ConfigError):
        parse_args(["-n", "2"])


def _args(**kw):
    base = dict(num_workers=3, num_servers=2, interface=None, env=[], env_server=[],
                env_worker=[], ssh_port=None, ssh_identity_file=None, command=["train"])
    base.update(kw)
    return argparse.Namespace(**base)


def test_plan_one_scheduler_servers_and_workers_round_robin():
    hosts = [Host("127.0.0.2", 2), Host("127.0.0.3", 2)]
    procs = plan(_args(env_worker=[("A", "1")], env_server=[("B", "2")]), hosts, "127.0.0.1",
                 9000)
    roles = [(p["role"], p["index"], p["host"] and p["host"].address) for p in procs]
    assert roles == [("scheduler", 0, None), ("server", 0, "127.0.0.2"),
                     ("server", 1, "127.0.0.3"), ("worker", 0, "127.0.0.2"),
                     ("worker", 1, "127.0.0.3"), ("worker", 2, "127.0.0.2")]
    for p in procs:
        env = p["env"]
        assert (env["DMLC_ROLE"], env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"]) == \
            (p["role"], "127.0.0.1", "9000")
        assert (env["DMLC_NUM_SERVER"], env["DMLC_NUM_WORKER"]) == ("2", "3")
        assert env["DMLC_NODE_HOST"] == (p["host"].address if p["host"] else "127.0.0.1")
        assert ("A" in env) == (p["role"] == "worker") and ("B" in env) == (p["role"] == "server")
    workers = [p["env"] for p in procs if p["role"] == "worker"]
    assert [(w["HVDTRAIN_LOCAL_RANK"], w["HVDTRAIN_LOCAL_SIZE"]) for w in workers] == \
        [("0", "2"), ("0", "1"), ("1", "2")]


def test_stop_signals_go_to_the_workers_alone():
    """Local workers get the signal, workers over ssh a stop line on stdin; the scheduler and
    servers nothing (the workers need them to save)."""
    hosts = [Host("127.0.0.2", 2)]
    for where, wanted in (([], "signal"), (hosts, "stdin")):
        args = _args()
        members = launcher_module.members(args, plan(args, where, "127.0.0.1", 9000), "/w")
        assert [(m.name.split()[0], m.forward) for m in members] == \
            [("scheduler", None)] + [("server", None)] * 2 + [("worker", wanted)] * 3


def test_interface_replaces_node_host():
    procs = plan(_args(interface="eth7"), [], "127.0.0.1", 1)
    assert all(p["env"]["DMLC_INTERFACE"] == "eth7" and "DMLC_NODE_HOST" not in p["env"]
               for p in procs)


def test_remote_command_runs_in_the_workdir_and_dies_with_ssh():
    proc = plan(_args(ssh_port=2222, ssh_identity_file="/k"), [Host("h1")], "10.0.0.1", 5)[-1]
    argv = remote_argv(_args(ssh_port=2222, ssh_identity_file="/k"), proc, ["train", "a b"],
                       "/work dir")
    assert argv[:1] == ["ssh"] and ["-p", "2222"] == argv[argv.index("-p"):argv.index("-p") + 2]
    assert argv[-2] == "h1"
    assert argv[-1].startswith("cd '/work dir' && exec ") and "--watch-stdin" in argv[-1]
    assert "'a b'" in argv[-1] and "--env=DMLC_ROLE=worker" in argv[-1]


def test_scheduler_address():
    assert scheduler_address([Host("127.0.0.2")]) == "127.0.0.1"
    assert scheduler_address([Host("d1")], override="10.1.1.1") == "10.1.1.1"


def test_mpi_roles_and_command():
    assert [mpi_role(r, 2) for r in range(5)] == [("scheduler", 0), ("server", 0), ("server", 1),
                                                   ("worker", 0), ("worker", 1)]
    argv = mpi_argv(_args(), [], 7000)
    assert argv[argv.index("-np") + 1] == "6" and argv[-2:] == ["--", "train"]
    assert "--mpi-role" in argv and "--node-host" in argv


def test_exit_status():
    assert exit_status(0) == 0 and exit_status(3) == 3 and exit_status(-9) == 137


def _py(code):
    return [sys.executable, "-c", code]


def test_job_fails_fast_and_kills_the_rest(tmp_path):
    import io
    out = io.BytesIO()
    pidfile = tmp_path / "pid"
    job = Job([Member("worker 0", _py(f"import os,time; open('{pidfile}','w').write(str("
                                      f"os.getpid())); time.sleep(3600)")),
               Member("worker 1", _py("import time,sys; time.sleep(1); print('bye'); "
                                      "sys.exit(3)")),
               Member("server 0", _py("import time; time.sleep(3600)"), essential=False)],
              out=out)
    start = time.monotonic()
    assert job.run() == 3
    # The others sleep an hour: returning at all means they were stopped, not waited for
    # (the bound is generous for a busy machine).
    assert time.monotonic() - start < 300
    text = out.getvalue().decode()
    assert "[worker 1] bye" in text and "worker 1 exited with status 3" in text
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


def test_job_succeeds_when_workers_finish_and_stops_lingering_servers():
    import io
    job = Job([Member("worker 0", _py("print('done')")),
               Member("server 0", _py("import time; time.sleep(3600)"), essential=False)],
              linger=0.5, out=io.BytesIO())
    start = time.monotonic()
    assert job.run() == 0
    assert time.monotonic() - start < 300  # the server sleeps an hour: it was stopped


def test_a_member_that_cannot_start_stops_those_already_started(tmp_path):
    import io
    out = io.BytesIO()
    pidfile = tmp_path / "pid"
    job = Job([Member("scheduler", _py(f"import os,time; open('{pidfile}','w').write(str("
                                       f"os.getpid())); time.sleep(60)"), essential=False),
               Member("worker 0", [str(tmp_path / "no-such-program"), "--epochs", "1"])],
              out=out)
    assert job.run() == 127
    text = out.getvalue().decode()
    assert text.count("\n") == 1 and "cannot start worker 0" in text, text
    assert "No such file or directory" in text
    assert job.members[0].process.poll() is not None  # killed and reaped


@pytest.mark.parametrize("kind", ["local", "mpi"])
def test_a_mistyped_worker_command_is_refused_before_anything_starts(kind, capfd):
    # The mpi case of tests/dist/test_parameter_server.py's
    # test_mistyped_worker_command_is_one_line_and_leaves_nothing (which keeps local as a real
    # process): main() returns before any Job exists, so nothing can be left running.
    from hvdtrain.launch.launcher import main
    assert main(["-n", "2", "-s", "1", "--launcher", kind, "hvdtrian", "--kvstore",
                 "dist_sync"]) == 2
    out, err = capfd.readouterr()
    assert (out + err).strip().splitlines() == [
        "hvdtrain-launch: error: worker command 'hvdtrian' not found: it is not on PATH "
        "(a typo?)"]
    assert main(["-n", "1", "--launcher", kind, "/no/such/hvdtrain"]) == 2
    assert "'/no/such/hvdtrain' not found: it is not an executable file" in capfd.readouterr().err


# A worker as hvdtrain behaves on a stop signal: it takes a while to save, then exits 75.
SAVING_WORKER = """
import os, signal, sys, time
open({ready!r}, "w").close()
got = []
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, lambda s, f: got.append(signal.Signals(s).name))
while not got:
    time.sleep(0.02)
time.sleep({save_s})
print("saved after", got[0], flush=True)
sys.exit(75)
"""


def _signal_when_ready(ready_files, signals, gap=0.0):
    """In a thread: once every file exists, send this process `signals`, `gap` s apart."""
    import threading

    def send():
        while not all(os.path.exists(f) for f in ready_files):
            time.sleep(0.05)
        for signum in signals:
            os.kill(os.getpid(), signum)
            time.sleep(gap)
    threading.Thread(target=send, daemon=True).start()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_stop_signal_reaches_the_workers_and_the_job_waits_for_their_saves(signum, tmp_path):
    """hvdtrain-launch passes the signal on to the workers alone (the scheduler and servers
    must outlive their saves) and waits: a worker that stops on request (75) does not bring
    down one still saving. It used to SIGKILL every member at once."""
    import io
    out = io.BytesIO()
    ready = [str(tmp_path / f"ready{i}") for i in range(2)]
    server_log = tmp_path / "server"
    job = Job([Member(f"worker {i}", _py(SAVING_WORKER.format(ready=ready[i], save_s=0.2 + 2 * i)),
                      forward="signal") for i in range(2)] +
              [Member("server 0", _py(f"import signal, time\n"
                                      f"signal.signal(signal.SIGTERM, lambda s, f: open("
                                      f"{str(server_log)!r}, 'w').write('TERM'))\n"
                                      f"time.sleep(3600)"), essential=False)], out=out)
    _signal_when_ready(ready, [signum])
    assert job.run() == 75
    text = out.getvalue().decode()
    name = signal.Signals(signum).name
    assert f"[worker 0] saved after {name}" in text and f"[worker 1] saved after {name}" in text
    assert f"got {name}: passed on to the workers" in text
    assert "workers stopped on request (status 75)" in text
    assert not server_log.exists()  # the server got no signal; it was killed at the end


def test_a_second_stop_signal_kills_the_job_at_once(tmp_path):
    import io
    ready = [str(tmp_path / "ready")]
    job = Job([Member("worker 0", _py(SAVING_WORKER.format(ready=ready[0], save_s=3600)),
                      forward="signal")], out=io.BytesIO())
    _signal_when_ready(ready, [signal.SIGTERM, signal.SIGTERM], gap=2.5)
    start = time.monotonic()
    assert job.run() == 128 + signal.SIGTERM
    assert time.monotonic() - start < 300  # the worker would save for an hour


def test_remote_passes_a_stop_line_on_to_its_worker_as_sigusr1(tmp_path):
    """A worker over ssh: hvdtrain-launch writes a stop line to the ssh client's stdin;
    remote.py, watching its stdin, sends its worker SIGUSR1 (hvdtrain saves and stops)."""
    ready = tmp_path / "ready"
    remote = os.path.join(os.path.dirname(launcher_module.__file__), "remote.py")
    proc = subprocess.Popen([sys.executable, remote, "--watch-stdin", "--env=DMLC_ROLE=worker",
                             "--"] + _py(SAVING_WORKER.format(ready=str(ready), save_s=0)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 75
        assert proc.stdout.read().strip() == "saved after SIGUSR1"
    finally:
        proc.kill()


SIGNALLED_WHILE_STARTING = """
import os, runpy, signal, subprocess, sys
real_popen = subprocess.Popen
def popen(*args, **kwargs):  # the signal comes while remote.py starts its command
    os.kill(os.getpid(), signal.SIGTERM)
    return real_popen(*args, **kwargs)
subprocess.Popen = popen
sys.argv = [{remote!r}, "--", sys.executable, "-c", "import time; time.sleep(60)"]
runpy.run_path({remote!r}, run_name="__main__")
"""


def test_a_signal_to_remote_while_it_starts_its_command_still_ends_that_command():
    """A TERM that reaches remote.py before its command exists is kept and acted on once the
    command does (its handlers came after the start: remote.py died, its command ran on)."""
    remote = os.path.join(os.path.dirname(launcher_module.__file__), "remote.py")
    proc = subprocess.run([sys.executable, "-c", SIGNALLED_WHILE_STARTING.format(remote=remote)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr  # its command, killed
