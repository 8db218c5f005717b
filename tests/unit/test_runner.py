"""runner.py: how hvdtrain-launch runs a worker's or server's command (replaces the old
worker_hook/sitecustomize tests: exit status, finally/atexit, shadowed sitecustomize)."""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from hvdtrain.launch.launcher import members, parse_args, plan
from hvdtrain.launch.remote import SCHEDULER_PROCESS
from hvdtrain.launch.command import command_argv, plan as run_plan, split_command
from hvdtrain.launch.runner import RUNNER, runner_argv

# A stand-in for MXNet with its contract: a KVStore whose finalizer blocks (ps-lite's exit
# barrier, waiting for peers) unless MXKVStoreSetBarrierBeforeExit(handle, 0) was called.
FAKE_MXNET = {
    "mxnet/__init__.py": "",
    "mxnet/base.py": textwrap.dedent("""
        class _Lib:
            def MXKVStoreSetBarrierBeforeExit(self, handle, flag):
                handle["barrier"] = flag.value
        _LIB = _Lib()
    """),
    "mxnet/kvstore/__init__.py": "",
    "mxnet/kvstore/kvstore.py": textwrap.dedent("""
        import threading
        import mxnet.base
        class KVStore:
            def __init__(self):
                self.handle = {"barrier": 1}
            def __del__(self):
                if self.handle["barrier"]:
                    print("finalizer waits", flush=True)
                    threading.Event().wait()  # the peers never arrive
    """),
}

PROGRAM = textwrap.dedent("""
    import atexit, sys
    from mxnet.kvstore.kvstore import KVStore
    atexit.register(lambda: print("atexit ran", flush=True))
    out = open("out.txt", "w")
    out.write("buffered")
    def main():
        store = KVStore()
        try:
            {fail}
        finally:
            print("finally ran", flush=True)
    main()
""")


@pytest.fixture
def fake_mxnet(tmp_path):
    for name, text in FAKE_MXNET.items():
        (tmp_path / "lib" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lib" / name).write_text(text)
    return str(tmp_path / "lib")


def run(argv, cwd, pythonpath, env=None, timeout=60):
    """subprocess.run in a session of its own: on timeout (the hanging references) the
    whole group is killed, or bash's stuck Python child would outlive the suite."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=pythonpath, **(env or {})))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def assert_hangs_in_the_finalizer(argv, cwd, pythonpath):
    """The reference: run alone, the program leaves main() (it prints "finally ran") and
    then blocks for good in the store's finalizer (which prints "finalizer waits" first).
    Waiting for that line, not for a fixed time, keeps this quick; a program that exits
    instead fails at once."""
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True,
                                env=dict(os.environ, PYTHONPATH=pythonpath))
        try:
            deadline = time.monotonic() + 60
            while True:
                out.seek(0)
                seen = out.read()
                if "finalizer waits" in seen:
                    break
                assert proc.poll() is None, f"exited with {proc.returncode}: no hang to avoid"
                assert time.monotonic() < deadline, "no 'finalizer waits' within 60 s"
                time.sleep(0.1)
            assert "finally ran" in seen, seen
            assert proc.poll() is None, f"exited with {proc.returncode}: no hang to avoid"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("fail,status", [("sys.exit(3)", 3), ("exit(4)", 4),
                                         ("sys.exit('bad input')", 1),
                                         ("raise SystemExit(5)", 5),
                                         ("raise RuntimeError('boom')", 1)])
def test_a_failing_program_exits_as_alone_despite_the_blocking_finalizer(
        fail, status, tmp_path, fake_mxnet):
    (tmp_path / "prog.py").write_text(PROGRAM.format(fail=fail))
    proc = run(runner_argv([sys.executable, "prog.py"]), tmp_path, fake_mxnet)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == "finally ran\natexit ran\n"
    assert (tmp_path / "out.txt").read_text() == "buffered"  # flushed at exit, as alone
    # The message or traceback is Python's own, without the runner's frames.
    assert "runner.py" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr
    if "boom" in fail:
        assert proc.stderr.startswith("Traceback") and "RuntimeError: boom" in proc.stderr
    assert_hangs_in_the_finalizer([sys.executable, "prog.py"], tmp_path, fake_mxnet)


@pytest.mark.parametrize("code", ["sys.exit(0)", "pass",
                                  "try:\n    sys.exit(2)\nexcept SystemExit:\n    pass"])
def test_a_program_that_ends_well_is_untouched(code, tmp_path):
    program = textwrap.dedent("""
        import atexit, sys, threading
        atexit.register(print, "atexit ran")
        t = threading.Thread(target=sys.exit, args=(7,))
        t.start(); t.join()
    """) + code + "\n"
    (tmp_path / "prog.py").write_text(program)
    alone = run([sys.executable, "prog.py"], tmp_path, "")
    proc = run(runner_argv([sys.executable, "prog.py"]), tmp_path, "")
    assert (proc.returncode, proc.stdout, proc.stderr) == (alone.returncode, alone.stdout,
                                                           alone.stderr)
    assert alone.returncode == 0 and alone.stdout == "atexit ran\n"


def test_a_site_wide_excepthook_still_runs(tmp_path, fake_mxnet):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "def hook(t, v, tb):\n"
        "    print('their hook', t.__name__, flush=True)\n"
        "    sys.__excepthook__(t, v, tb)\n"
        "sys.excepthook = hook\n")
    (tmp_path / "prog.py").write_text(PROGRAM.format(fail="raise RuntimeError('boom')"))
    proc = run(runner_argv([sys.executable, "prog.py"]), tmp_path,
               os.pathsep.join([str(site), fake_mxnet]))
    assert proc.returncode == 1 and "their hook RuntimeError" in proc.stdout, proc.stdout


def test_the_script_sees_argv_and_path_as_alone(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "app" / "prog.py").write_text(
        "import sys, helper\nprint(sys.argv, helper.VALUE, __name__)\n")
    argv = [sys.executable, "app/prog.py", "--x", "a b"]
    alone = run(argv, tmp_path, "")
    proc = run(runner_argv(argv), tmp_path, "")
    assert proc.stdout == alone.stdout == "['app/prog.py', '--x', 'a b'] 42 __main__\n"


def test_a_server_that_never_imports_mxnet_is_one_line(tmp_path):
    (tmp_path / "prog.py").write_text("print('trained on a server!')\n")
    proc = run(runner_argv([sys.executable, "prog.py"]), tmp_path, "",
               env={"DMLC_ROLE": "server"})
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "without importing mxnet" in proc.stderr


def test_a_command_given_as_one_string_is_read_as_bash_reads_it():
    assert command_argv(["python3 prog.py --lr 0.1"]) == ["python3", "prog.py", "--lr", "0.1"]
    assert command_argv(["python3 'my prog.py'"]) == ["python3", "my prog.py"]
    assert command_argv(["python3 a.py | tee log"]) == ["bash", "-c", "python3 a.py | tee log"]
    assert command_argv(["python3", "a b.py"]) == ["python3", "a b.py"]  # argv: as given
    # Leading assignments (bash's, or env's) go to the program's environment.
    assert split_command(["OMP_NUM_THREADS=1 A='x y' python3 a.py"]) == (
        {"OMP_NUM_THREADS": "1", "A": "x y"}, ["python3", "a.py"])
    assert split_command(["env", "A=1", "python3", "a.py"]) == ({"A": "1"}, ["python3", "a.py"])
    assert split_command(["A=$HOME python3 a.py"]) == ({}, ["bash", "-c", "A=$HOME python3 a.py"])


SHELL_FORMS = [("python3 prog.py; echo after", 3), ("python3 prog.py && echo after", 3),
               ("python3 prog.py | cat", 3), ("true && FOO=1 python3 prog.py || echo retry", 3),
               ("echo fine; python3 -c 'print(1)'", 0)]


@pytest.mark.parametrize("command,status", SHELL_FORMS)
def test_a_failing_python_program_in_a_shell_command_ends_it_with_its_status(
        command, status, tmp_path, fake_mxnet):
    # With the blocking finalizer, a Python program run by the shell alone would hang; run
    # through the runner it exits, and the shell command ends with its status at once, even
    # where the shell would go on ('; echo after', a pipe, '|| echo retry').
    (tmp_path / "prog.py").write_text(PROGRAM.format(fail="sys.exit(3)"))
    proc = run(runner_argv([command]), tmp_path, fake_mxnet)
    assert proc.returncode == status, proc.stderr
    assert "after" not in proc.stdout and "retry" not in proc.stdout, proc.stdout
    if status:
        assert proc.stdout.startswith("finally ran\natexit ran\n"), proc.stdout
        assert (tmp_path / "out.txt").read_text() == "buffered"
        assert_hangs_in_the_finalizer(["bash", "-c", command], tmp_path, fake_mxnet)


def test_which_commands_run_through_the_runner(tmp_path):
    assert run_plan(["python3", "-u", "-W", "ignore", "t.py", "-v"]) == (
        ["python3", "-u", "-W", "ignore"], "script", "t.py", ["-v"])
    assert run_plan(["python", "-m", "pkg.mod", "x"]) == (["python"], "module", "pkg.mod", ["x"])
    assert run_plan(["python3.11", "-c", "print(1)"]) == (["python3.11"], "code", "print(1)", [])
    assert run_plan(["python3", "-i", "t.py"]) is None  # interactive: as is
    console = tmp_path / "tool"
    console.write_text("#!/opt/venv/bin/python3.11\nimport sys\n")
    env_script = tmp_path / "envtool"
    env_script.write_text("#!/usr/bin/env python3\n")
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/bash\npython3 train.py\n")
    assert run_plan([str(console), "--epochs", "1"]) == (
        ["/opt/venv/bin/python3.11"], "script", str(console), ["--epochs", "1"])
    assert run_plan([str(env_script)]) == (["python3"], "script", str(env_script), [])
    assert run_plan([str(shell)]) is None  # a shell script runs as is
    assert run_plan(["no-such-program-here"]) is None


def test_servers_and_workers_run_the_users_command_the_scheduler_mxnet_alone():
    args = parse_args(["-n", "2", "-s", "1", "python3", "train.py"])
    procs = plan(args, [], "127.0.0.1", 9)
    argvs = {(m.name): m.argv for m in members(args, procs, "/w")}
    assert argvs["scheduler"] == SCHEDULER_PROCESS
    for name in ("server 0", "worker 0", "worker 1"):
        assert argvs[name] == [sys.executable, RUNNER, "--", "python3", "train.py"]


def test_a_missing_script_fails_as_python_alone_does(tmp_path, fake_mxnet):
    """Python says "can't open file" and exits 2; the runner said FileNotFoundError, 1."""
    alone = run([sys.executable, "nope.py"], tmp_path, fake_mxnet)
    through = run(runner_argv([sys.executable, "nope.py"]), tmp_path, fake_mxnet)
    assert through.returncode == alone.returncode == 2
    assert through.stderr.strip() == alone.stderr.strip(), (through.stderr, alone.stderr)


def test_ending_a_tree_that_is_forking_leaves_no_orphan(tmp_path):
    """The runner of a shell command ends its tree when its parent dies; a list of the tree
    read from /proc and then SIGKILLed missed a child bash forked just after the read, which
    ran on as an orphan (a worker outlived its job in CI). Here bash forks sleeps as fast as it
    can while the tree is ended: none may be left."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    command_path = os.path.join(os.path.dirname(run_plan.__code__.co_filename), "command.py")
    ender = tmp_path / "ender.py"
    ender.write_text(textwrap.dedent(f"""
        import importlib.util, os, subprocess, time
        # The module alone (standard library only): importing hvdtrain would import MXNet.
        spec = importlib.util.spec_from_file_location("command", {command_path!r})
        command = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(command)
        subprocess.Popen(["bash", "-c", "while :; do sleep 60 & done"],
                         env=dict(os.environ, ORPHAN_CHECK="{tag}"))
        time.sleep(0.3)  # bash is forking now
        command._kill_descendants(os.getpid())
    """))
    subprocess.run([sys.executable, str(ender)], check=True, timeout=120)

    def tagged():
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/environ", "rb") as env:
                    if f"ORPHAN_CHECK={tag}".encode() not in env.read():
                        continue
                with open(f"/proc/{entry}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                        found.append(int(entry))
            except (OSError, ValueError):
                continue
        return found
    time.sleep(0.5)
    survivors = tagged()
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
