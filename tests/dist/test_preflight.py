"""hvdtrain-check started like a job: under each launcher, on two loopback hosts, and with a
rank that runs another install of hvdtrain."""
import os
import re
import shutil
import stat

import pytest

from helpers import REPO, run_command, tool
from hvdtrain.data.datasets import write_cifar_files
from hvdtrain.check.rankfacts import COLUMNS
from jobs import JOB_TIMEOUT, LAUNCHERS, launcher
from loopback_hosts import SSH_OPTIONS, loopback_hosts

pytestmark = pytest.mark.dist
# horovodrun's and mpirun's output tags; Open MPI tags each chunk it forwards, so a tag can
# also land inside a line that reached it in two pieces.
PREFIX = re.compile(r"\[[\d,]+\]<std(out|err)>:")
CHECK = ["--size-mb", "1", "--rounds", "2"]


def table(out):
    """{rank: {column: cell}} from the table rank 0 printed."""
    rows = {}
    for line in out.splitlines():
        cells = PREFIX.sub("", line).split()
        if len(cells) == len(COLUMNS) and cells[0].isdigit():
            rows[int(cells[0])] = dict(zip(COLUMNS, cells))
    return rows


def summary(out):
    return next(PREFIX.sub("", l) for l in out.splitlines() if " ranks ready" in l)


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cifar")
    write_cifar_files(str(folder), num_train=20, num_test=5)
    return str(folder)


def wrapper(folder):
    """A script that starts hvdtrain-check with `folder` first on the Python path on the rank
    named by HVDTRAIN_TEST_OTHER_RANK, as if that rank's host had another install."""
    script = folder / "check-with-other-install"
    script.write_text(
        "#!/bin/sh\n"
        'rank=${OMPI_COMM_WORLD_RANK:-$HOROVOD_RANK}\n'
        f'[ "$rank" = "$HVDTRAIN_TEST_OTHER_RANK" ] && export PYTHONPATH={folder}\n'
        f'exec {tool("hvdtrain-check")} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.fixture(scope="module")
def other_install(tmp_path_factory):
    """Another copy of hvdtrain: another version at another path."""
    folder = tmp_path_factory.mktemp("other")
    shutil.copytree(os.path.join(REPO, "hvdtrain"), folder / "hvdtrain")
    init = folder / "hvdtrain" / "__init__.py"
    init.write_text(re.sub(r'__version__ = ".*"', '__version__ = "0.0.9"', init.read_text()))
    return wrapper(folder)


@pytest.fixture(scope="module")
def broken_horovod(tmp_path_factory):
    """A Horovod that does not import (a host where its build is broken)."""
    folder = tmp_path_factory.mktemp("broken")
    (folder / "horovod").mkdir()
    (folder / "horovod" / "__init__.py").write_text(
        'raise ImportError("libhorovod.so: cannot open shared object file")\n')
    return wrapper(folder)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_every_rank_ready_under_each_launcher(name, cifar_dir):
    proc = run_command(launcher(name) + [tool("hvdtrain-check"), "--data-dir", cifar_dir]
                       + CHECK, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = table(proc.stdout)
    assert sorted(rows) == [0, 1], proc.stdout[-4000:]
    assert sorted(r["local"] for r in rows.values()) == ["0", "1"]
    assert all(r["status"] == "ok" and r["data"].startswith("ok(") and r["build"] == "MPI+Gloo"
               and r["device"] == "cpu(0)" for r in rows.values()), proc.stdout[-4000:]
    via = "the Horovod store" if name == "horovodrun-gloo" else "mpi4py"
    assert f"facts gathered through {via}" in proc.stdout
    assert summary(proc.stdout) == "2 of 2 ranks ready"
    assert re.search(r"allreduce of 1 MB float32 on cpu\(0\) across 2 ranks: .* bandwidth "
                     r"\d+\.\d+ GB/s .*sums correct on every rank", proc.stdout), proc.stdout


# A rank with another install, under each launcher: test_two_hosts_and_a_rank_that_differs
# (the same wrapper on the fourth rank, on the second host).


def test_a_rank_whose_horovod_does_not_load_is_named_without_a_hang(broken_horovod):
    proc = run_command(launcher("mpirun") + [broken_horovod] + CHECK, timeout=JOB_TIMEOUT,
                       env={"HVDTRAIN_TEST_OTHER_RANK": "1"})
    assert proc.returncode == 1, proc.stdout[-4000:]
    rows = table(proc.stdout)
    assert (rows[0]["status"], rows[1]["status"], rows[1]["build"]) == ("ok", "FAIL", "-")
    assert "cannot import horovod: ImportError: libhorovod.so" in proc.stdout
    assert "allreduce skipped: Horovod does not load on every rank" in proc.stdout
    # Without MPI the facts need the store: the broken rank says why and the job ends.
    proc = run_command(launcher("horovodrun-gloo") + [broken_horovod] + CHECK,
                       timeout=JOB_TIMEOUT, env={"HVDTRAIN_TEST_OTHER_RANK": "1"})
    assert proc.returncode != 0
    assert "hvdtrain-check: error: Horovod does not start on this rank: ImportError: " \
           "libhorovod.so" in proc.stdout, proc.stdout[-4000:]


def test_unreadable_data_fails_every_rank(tmp_path):
    proc = run_command(launcher("mpirun") + [tool("hvdtrain-check"), "--data-dir",
                                             str(tmp_path / "nowhere")] + CHECK,
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert summary(proc.stdout).endswith("ranks that differ or cannot run a job: 0, 1")
    assert "is not a folder on this host" in proc.stdout


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with loopback_hosts(tmp_path_factory.mktemp("ssh")) as running:
        yield running


def two_host_command(mode, hosts):
    """Four ranks, two on each loopback host (as tests/dist/test_multihost.py runs jobs)."""
    port_key = ["-p", str(hosts.port), "-i", hosts.key]
    if mode == "horovodrun":
        return [tool("horovodrun"), "-np", "4", "-H", "127.0.0.2:2,127.0.0.3:2", *port_key,
                "--network-interface", "lo"]
    if mode == "horovodrun-gloo":
        return [tool("horovodrun"), "--gloo", "-np", "4", "-H", "127.0.0.2:2,127.0.0.3:2",
                *port_key, "--network-interface", "lo"]
    hostfile = hosts.hostfile(fmt="{address} slots={slots}", name="mpi.hostfile")
    return ["mpirun", "--allow-run-as-root", "-np", "4", "--hostfile", hostfile,
            "--bind-to", "none", "-mca", "plm_rsh_args",
            " ".join(SSH_OPTIONS + port_key), "-mca", "btl", "tcp,self",
            "-mca", "btl_tcp_if_include", "lo", "-mca", "oob_tcp_if_include", "lo",
            "-x", "PATH", "-x", "HVDTRAIN_TEST_OTHER_RANK"]


@pytest.mark.parametrize("mode", ["horovodrun", "horovodrun-gloo", "mpirun"])
def test_two_hosts_and_a_rank_that_differs(mode, hosts, other_install, monkeypatch):
    """Four ranks on two hosts under each launcher; the fourth runs another install (another
    version at another path), which the table and its line name."""
    if mode == "horovodrun" and not hosts.distinct_hostnames:
        pytest.skip("Open MPI's shared-memory transport crashes when two 'hosts' share one "
                    "hostname, and this sandbox cannot give them their own (unshare --uts)")
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    proc = run_command(two_host_command(mode, hosts) + [other_install] + CHECK,
                       timeout=JOB_TIMEOUT, env={"HVDTRAIN_TEST_OTHER_RANK": "3"})
    assert proc.returncode == 1, proc.stdout[-4000:]
    rows = table(proc.stdout)
    assert sorted(rows) == [0, 1, 2, 3], proc.stdout[-4000:]
    assert [rows[r]["local"] for r in range(4)] == ["0", "1", "0", "1"]
    if hosts.distinct_hostnames:
        assert [rows[r]["host"] for r in range(4)] == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 2
    assert [rows[r]["status"] for r in range(4)] == ["ok", "ok", "ok", "FAIL"]
    assert rows[3]["hvdtrain"] == "0.0.9"
    assert summary(proc.stdout) == ("3 of 4 ranks ready; ranks that differ or cannot run a "
                                    "job: 3")
    assert re.search(r"rank 3 \(.*\): hvdtrain 0\.0\.9 \(most ranks: 0\.1\.0\); hvdtrain_path "
                     r"\S+/other\d*/hvdtrain", proc.stdout), proc.stdout[-4000:]
    assert re.search(r"across 4 ranks: .*sums correct on every rank", proc.stdout)
