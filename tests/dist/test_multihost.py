"""Horovod across two "hosts" (127.0.0.2 and 127.0.0.3, private sshd), two ranks each."""
import collections
import os

import pytest

from helpers import REPO, run_command, tool
from jobs import DIGITS, JOB_TIMEOUT, assert_same_params, run_ranks
from loopback_hosts import SSH_OPTIONS, loopback_hosts

pytestmark = pytest.mark.dist
HOSTS = "127.0.0.2:2,127.0.0.3:2"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with loopback_hosts(tmp_path_factory.mktemp("ssh")) as running:
        yield running


def _ssh_args(hosts):
    return " ".join(SSH_OPTIONS + ["-p", str(hosts.port), "-i", hosts.key])


def command(mode, hosts):
    port_key = ["-p", str(hosts.port), "-i", hosts.key]
    if mode == "horovodrun":
        return [tool("horovodrun"), "-np", "4", "-H", HOSTS, *port_key,
                "--network-interface", "lo"]
    if mode == "horovodrun-hostfile":
        hostfile = hosts.hostfile(fmt="{address} slots={slots}", name="hvd.hostfile")
        return [tool("horovodrun"), "-np", "4", "--hostfile", hostfile, *port_key,
                "--network-interface", "lo"]
    if mode == "horovodrun-gloo":
        return [tool("horovodrun"), "--gloo", "-np", "4", "-H", HOSTS, *port_key,
                "--network-interface", "lo"]
    if mode == "mpirun-hostfile":
        hostfile = hosts.hostfile(fmt="{address} slots={slots}", name="mpi.hostfile")
        return ["mpirun", "--allow-run-as-root", "-np", "4", "--hostfile", hostfile,
                "--bind-to", "none", "-mca", "plm_rsh_args", _ssh_args(hosts),
                "-mca", "btl", "tcp,self", "-mca", "btl_tcp_if_include", "lo",
                "-mca", "oob_tcp_if_include", "lo", "-x", "PATH"]
    raise ValueError(mode)


@pytest.mark.parametrize("mode", ["horovodrun", "horovodrun-hostfile", "horovodrun-gloo",
                                  "mpirun-hostfile"])
def test_four_ranks_on_two_hosts(mode, hosts, tmp_path, monkeypatch):
    if mode in ("horovodrun", "horovodrun-hostfile") and not hosts.distinct_hostnames:
        pytest.skip("Open MPI's shared-memory transport crashes when two 'hosts' share one "
                    "hostname, and this sandbox cannot give them their own (unshare --uts)")
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    results, params, out = run_ranks(command(mode, hosts), tmp_path,
                                     DIGITS + ["--epochs", "12", "--lr", "0.1"])
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["num_workers"] == 4 and r["local_size"] == 2 for r in results)
    placed = collections.defaultdict(list)
    for r in results:
        placed[r["ssh_connection"].split()[2]].append(r["local_rank"])
    assert {h: sorted(l) for h, l in placed.items()} == {"127.0.0.2": [0, 1],
                                                         "127.0.0.3": [0, 1]}
    accuracies = {r["test_acc"] for r in results}
    assert len(accuracies) == 1 and accuracies.pop() >= 0.95, out[-3000:]
    for other in params[1:]:
        assert_same_params(params[0], other)
    info = [l for l in out.splitlines() if " INFO " in l]
    assert info and all("[rank 0]" in l for l in info)


def test_check_cluster_reports_each_host(hosts, tmp_path):
    good = hosts.hostfile(slots=2, name="good")
    proc = run_command([os.path.join(REPO, "scripts", "check-cluster.sh"), "-p",
                        str(hosts.port), "-i", hosts.key, good], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout
    rows = [l.split() for l in proc.stdout.splitlines() if l.startswith("127.")]
    assert [r[0] for r in rows] == hosts.addresses
    assert all(r[1] == "ok" and r[5] == "ok" and r[-1] == "ok" for r in rows), proc.stdout
    assert "2 of 2 hosts ready" in proc.stdout

    bad = tmp_path / "bad"
    bad.write_text("127.0.0.2\n127.0.0.9\n")  # nothing listens on 127.0.0.9
    proc = run_command([os.path.join(REPO, "scripts", "check-cluster.sh"), "-p",
                        str(hosts.port), "-i", hosts.key, str(bad)], timeout=JOB_TIMEOUT)
    assert proc.returncode == 1, proc.stdout
    rows = {l.split()[0]: l for l in proc.stdout.splitlines() if l.startswith("127.")}
    assert rows["127.0.0.2"].rstrip().endswith("ok")
    assert "FAIL" in rows["127.0.0.9"]
    assert "1 of 2 hosts ready; failed: 127.0.0.9" in proc.stdout
