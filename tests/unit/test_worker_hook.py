"""The exit hook hvdtrain-launch puts on workers' PYTHONPATH (hvdtrain/launch/worker_hook)."""
import os
import subprocess
import sys
import textwrap

import pytest

from hvdtrain.launch.launcher import parse_args, plan
from hvdtrain.launch.remote import WORKER_HOOK

# A local whose finalizer blocks, as MXNet's dist KVStore does when a peer never arrives.
PROGRAM = textwrap.dedent("""
    import atexit, sys, threading
    class Store:
        def __del__(self):
            threading.Event().wait()
    atexit.register(lambda: print("atexit ran", flush=True))
    def main():
        store = Store()
        try:
            {fail}
        finally:
            print("finally ran", flush=True)
    main()
""")


def run(fail, extra_path=(), timeout=60):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([WORKER_HOOK, *extra_path]))
    return subprocess.run([sys.executable, "-c", PROGRAM.format(fail=fail)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("fail,status", [("sys.exit(3)", 3), ("exit(4)", 4),
                                         ("sys.exit('bad input')", 1),
                                         ("raise RuntimeError('boom')", 1)])
def test_a_failing_program_exits_with_its_status_despite_a_blocking_finalizer(fail, status):
    proc = run(fail)
    assert proc.returncode == status, proc.stderr
    assert "finally ran" in proc.stdout  # the program unwound as usual
    if "raise" in fail:
        assert "RuntimeError: boom" in proc.stderr


def test_a_normal_exit_is_left_alone():
    proc = subprocess.run([sys.executable, "-c", "import atexit; atexit.register(print, "
                           "'atexit ran'); import sys; sys.exit(0)"],
                          env=dict(os.environ, PYTHONPATH=WORKER_HOOK), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "atexit ran\n"


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('theirs ran', flush=True)\n")
    proc = run("sys.exit(5)", extra_path=[str(tmp_path)])
    assert proc.returncode == 5 and proc.stdout.startswith("theirs ran\n"), proc.stdout


def test_workers_get_the_hook_first_on_their_path_and_servers_do_not(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/user/lib")
    procs = plan(parse_args(["-n", "2", "-s", "1", "python", "train.py"]), [], "127.0.0.1", 9)
    for proc in procs:
        path = proc["env"].get("PYTHONPATH")
        if proc["role"] == "worker":
            assert path == os.pathsep.join([WORKER_HOOK, "/user/lib"])
        else:
            assert path == "/user/lib"
