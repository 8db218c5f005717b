"""Which ancestors count as the launcher, and leaving when one of them is gone."""
import os
import subprocess
import sys
import time

from hvdtrain.runtime.lifeline import (EXIT_LAUNCHER_GONE, Ancestor, LauncherWatch, is_alive,
                               launcher_chain, launcher_name)


def _fake_proc(root, table):
    """Write /proc-like stat and cmdline files: table is {pid: (ppid, argv, state)}."""
    for pid, (ppid, argv, state) in table.items():
        folder = root / str(pid)
        folder.mkdir()
        rest = [state, str(ppid)] + ["0"] * 17 + [f"{1000 + pid}"] + ["0"] * 5
        (folder / "stat").write_text(f"{pid} (x y) " + " ".join(rest))
        (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_launcher_names():
    assert launcher_name(["mpirun", "-np", "2"]) == "mpirun"
    assert launcher_name(["/usr/bin/orted", "-mca"]) == "orted"
    assert launcher_name(["/v/bin/python3.11", "/v/bin/horovodrun", "-np", "2"]) == "horovodrun"
    assert launcher_name(["python", "/r/hvdtrain/launch/remote.py", "--"]) == "remote.py"
    assert launcher_name(["/bin/sh", "-c", "mpirun -np 2 x"]) == "sh -c mpirun"
    assert launcher_name(["/bin/sh", "-c", "cd /w ; python x"]) == "sh -c"
    assert launcher_name(["bash", "run.sh"]) is None
    assert launcher_name(["/v/bin/python", "/v/bin/pytest"]) is None
    assert launcher_name([]) is None


def test_chain_of_horovodrun_with_mpi_stops_at_whoever_started_it(tmp_path):
    # rank 40 <- mpirun 30 <- sh -c (what horovodrun became) 20 <- pytest 10 <- init
    _fake_proc(tmp_path, {
        40: (30, ["python", "/v/bin/hvdtrain"], "S"),
        30: (20, ["mpirun", "-np", "2"], "S"),
        20: (10, ["/bin/sh", "-c", "mpirun -np 2 ..."], "S"),
        10: (5, ["/v/bin/python", "/v/bin/pytest"], "S"),
        5: (1, ["bash", "-c", "make test"], "S")})
    chain = launcher_chain(40, str(tmp_path))
    assert [(a.pid, a.name) for a in chain] == [(30, "mpirun"), (20, "sh -c mpirun")]
    assert all(is_alive(a, str(tmp_path)) for a in chain)


def test_shells_above_the_topmost_launcher_are_not_watched(tmp_path):
    _fake_proc(tmp_path, {
        40: (30, ["python", "/v/bin/hvdtrain"], "S"),
        30: (20, ["python", "/v/bin/hvdtrain-launch", "-n", "2"], "S"),
        20: (1, ["bash", "-c", "cd /w && ./train.sh"], "S")})
    assert [a.pid for a in launcher_chain(40, str(tmp_path))] == [30]
    # Without a launcher above it (hvdtrain run from a shell) nothing is watched.
    plain = tmp_path / "plain"
    plain.mkdir()
    _fake_proc(plain, {41: (21, ["hvdtrain"], "S"), 21: (1, ["bash", "-c", "hvdtrain"], "S")})
    assert launcher_chain(41, str(plain)) == []


def test_dead_zombie_or_reused_pid_counts_as_gone(tmp_path):
    _fake_proc(tmp_path, {7: (1, ["mpirun"], "Z"), 8: (1, ["mpirun"], "S")})
    assert not is_alive(Ancestor(7, "1007", "mpirun"), str(tmp_path))
    assert not is_alive(Ancestor(8, "999", "mpirun"), str(tmp_path))  # another process now
    assert not is_alive(Ancestor(9, "1009", "mpirun"), str(tmp_path))
    assert is_alive(Ancestor(8, "1008", "mpirun"), str(tmp_path))
    exits = []
    watch = LauncherWatch([Ancestor(8, "1008", "mpirun"), Ancestor(9, "1009", "sh -c")],
                          describe=lambda: "rank 3", proc=str(tmp_path), exit=exits.append)
    assert watch.check() and exits == [EXIT_LAUNCHER_GONE]


def test_a_real_child_leaves_when_its_launcher_is_killed(tmp_path):
    """A 'mpirun' (a renamed shell) starts a Python child that watches it; killing the
    launcher alone ends the child within seconds."""
    fake_mpirun = tmp_path / "mpirun"
    fake_mpirun.symlink_to("/bin/sh")
    child = (f"import sys, time; sys.path.insert(0, {os.getcwd()!r}); "
             "from hvdtrain.runtime.lifeline import LauncherWatch, launcher_chain; "
             "w = LauncherWatch(launcher_chain(), interval=0.1).__enter__(); "
             "print(len(w.chain), flush=True); time.sleep(60)")
    launcher = subprocess.Popen([str(fake_mpirun), "-c", f"{sys.executable} -c \"{child}\"; "
                                 "echo done"], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline().strip() == "1"
        grandchild = [int(p) for p in subprocess.check_output(
            ["pgrep", "-P", str(launcher.pid)], text=True).split()]
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_running(p) for p in grandchild):
            time.sleep(0.1)
        assert not any(_running(p) for p in grandchild)
    finally:
        launcher.kill()


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as src:
            return src.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


EMFILE_CHILD = """
import os, resource, sys
from hvdtrain.runtime.lifeline import Ancestor, LauncherWatch
parent = os.getppid()
with open(f"/proc/{parent}/stat") as src:
    start = src.read().rsplit(")", 1)[1].split()[19]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(open(os.devnull))
except OSError as err:
    print("filled:", err.strerror, flush=True)
exits = []
watch = LauncherWatch([Ancestor(parent, start, "mpirun")], describe=lambda: "rank 1",
                      exit=exits.append)
print("ended:", watch.check(), watch.check(), exits, flush=True)
"""


def test_a_full_descriptor_table_does_not_end_a_healthy_rank():
    """EMFILE while reading the (alive) launcher's /proc entry proves nothing: keep
    watching, warn once."""
    proc = subprocess.run([sys.executable, "-c", EMFILE_CHILD], capture_output=True, text=True,
                          timeout=60, cwd=os.getcwd())
    assert "filled: Too many open files" in proc.stdout, proc.stderr
    assert "ended: False False []" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("cannot tell whether its launcher mpirun") == 1, proc.stderr


def test_a_vanished_launcher_ends_the_rank():
    gone = subprocess.Popen(["true"])
    with open(f"/proc/{gone.pid}/stat") as src:
        start = src.read().rsplit(")", 1)[1].split()[19]
    gone.wait()  # reaped: its /proc entry is gone (ENOENT)
    exits = []
    watch = LauncherWatch([Ancestor(gone.pid, start, "mpirun")], exit=exits.append)
    assert watch.check() and exits == [EXIT_LAUNCHER_GONE]


def test_an_unreadable_entry_is_unknown_not_gone(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").mkdir()  # reading it fails with EISDIR, not ENOENT
    exits = []
    watch = LauncherWatch([Ancestor(7, "1007", "mpirun")], proc=str(tmp_path), exit=exits.append)
    assert not watch.check() and exits == []
