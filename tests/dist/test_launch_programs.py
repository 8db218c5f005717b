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


@pytest.mark.parametrize("site", [False, True], ids=["plain", "apport-like-sitecustomize"])
@pytest.mark.parametrize("mode", ["caught_exit", "thread_exit", "buffered_exit", "atexit_exit",
                                  "mp_child"])
def test_a_correct_program_exits_and_writes_as_it_does_alone(mode, site, tmp_path):
    env = site_env(tmp_path, site)
    alone, launched = tmp_path / "alone", tmp_path / "launched"
    alone.mkdir()
    launched.mkdir()
    reference = run_command([sys.executable, PROGRAMS, mode], timeout=TIMEOUT, env=env,
                            cwd=str(alone))
    proc = run_command([tool("hvdtrain-launch"), "-n", "1", "-s", "1", sys.executable,
                        PROGRAMS, mode], timeout=TIMEOUT, env=env, cwd=str(launched))
    assert files(alone), reference.stdout  # the reference did something to compare with
    assert files(launched) == files(alone), proc.stdout[-3000:]
    assert proc.returncode == reference.returncode, proc.stdout[-3000:]


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
