"""A user's own program under hvdtrain-launch: it behaves as it does alone, and the servers run
it as MXNet's launch.py runs it (so they can load what it imports)."""
import os
import re
import sys
import textwrap

import pytest

from helpers import run_command, tool

pytestmark = pytest.mark.dist
HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "exit_programs.py")
TIMEOUT = 180

# A site-wide sitecustomize replacing sys.excepthook the way Ubuntu's apport does: its hook
# ends by calling sys.__excepthook__, not the hook it replaced.
APPORT_LIKE = textwrap.dedent("""
    import sys
    def _report(exc_type, exc, tb):
        with open("excepthook.txt", "a") as out:
            out.write(exc_type.__name__ + "\\n")
        sys.__excepthook__(exc_type, exc, tb)
    sys.excepthook = _report
""")


def site_env(tmp_path, site):
    if not site:
        return {}
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(APPORT_LIKE)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder),
                                                        os.environ.get("PYTHONPATH")]))}


def files(folder):
    return {name: (folder / name).read_text() for name in sorted(os.listdir(folder))}


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """alone(mode): (files written, status) of exit_programs.py MODE run by itself, once per
    mode for both site cases. Alone, no mode reaches sys.excepthook (SystemExit at the top
    level, or in a thread, never does; the rest ends well), the one thing the apport-like
    sitecustomize changes, so what it writes and its status are the same with it."""
    seen = {}

    def run(mode):
        if mode not in seen:
            folder = tmp_path_factory.mktemp(f"alone-{mode}")
            proc = run_command([sys.executable, PROGRAMS, mode], timeout=TIMEOUT,
                               cwd=str(folder))
            assert files(folder), proc.stdout  # the reference did something to compare with
            seen[mode] = files(folder), proc.returncode
        return seen[mode]
    return run


@pytest.mark.parametrize("site", [False, True], ids=["plain", "apport-like-sitecustomize"])
@pytest.mark.parametrize("mode", ["caught_exit", "thread_exit", "buffered_exit", "atexit_exit",
                                  "mp_child"])
def test_a_correct_program_exits_and_writes_as_it_does_alone(mode, site, tmp_path, alone):
    env = site_env(tmp_path, site)
    launched = tmp_path / "launched"
    launched.mkdir()
    written, status = alone(mode)
    proc = run_command([tool("hvdtrain-launch"), "-n", "1", "-s", "1", sys.executable,
                        PROGRAMS, mode], timeout=TIMEOUT, env=env, cwd=str(launched))
    assert files(launched) == written, proc.stdout[-3000:]
    assert proc.returncode == status, proc.stdout[-3000:]


APP = os.path.join(HERE, "ps_app")


@pytest.mark.parametrize("form", ["argv", "one-string"])
def test_servers_load_the_optimizer_from_the_users_module(form):
    # launch.py's form: the whole command as one string (run through a shell).
    program = [sys.executable, os.path.join(APP, "train.py")]
    command = [" ".join(program)] if form == "one-string" else program
    proc = run_command([tool("hvdtrain-launch"), "-n", "2", "-s", "2" if form == "one-string"
                        else "1"] + command, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = sorted(re.findall(r"worker (\d): w = \[(.*)\]", proc.stdout))
    assert found == [("0", "0.0, 0.0, 0.0"), ("1", "0.0, 0.0, 0.0")], proc.stdout[-3000:]


def test_an_optimizer_a_server_cannot_load_ends_the_job_in_one_line():
    proc = run_command([tool("hvdtrain-launch"), "-n", "2", "-s", "1", sys.executable,
                        os.path.join(APP, "inline_optimizer.py")], timeout=TIMEOUT)
    assert proc.returncode == 1, proc.stdout[-3000:]
    errors = [l for l in proc.stdout.splitlines() if "error" in l.lower()]
    assert len(errors) == 1 and "Can't get attribute 'InlineSGD'" in errors[0], proc.stdout
    assert "Traceback" not in proc.stdout and " w = " not in proc.stdout, proc.stdout[-3000:]
