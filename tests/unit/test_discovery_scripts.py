"""The host-discovery scripts of examples/elastic, run as Horovod's driver runs them: what
they print is what ``horovodrun --host-discovery-script`` reads (``HOST:SLOTS`` lines)."""
import os
import subprocess

from horovod.runner.elastic.discovery import HostDiscoveryScript

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "examples", "elastic")


def _discover(script, env):
    """The hosts and slots Horovod's own discovery class reads from `script`."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return HostDiscoveryScript(os.path.join(SCRIPTS, script), slots=None) \
            .find_available_hosts_and_slots()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_hostfile_script_reads_both_forms_and_skips_comments(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# the job's hosts\nd1:4\n\n  d2 slots=4   # a comment\n#d3:4\n")
    assert _discover("discover-hostfile.sh", {"ELASTIC_HOSTS": str(hosts)}) == \
        {"d1": 4, "d2": 4}
    hosts.write_text("d1:4\n")  # d2 taken out while the job runs
    assert _discover("discover-hostfile.sh", {"ELASTIC_HOSTS": str(hosts)}) == {"d1": 4}


def test_the_hostfile_script_leaves_out_what_is_not_a_host_and_says_so(tmp_path):
    """CRLF lines and tabs are read; a line Horovod would take for a host name ("h5slots=2")
    or fail on ("h7:2:3") is named on stderr and left out."""
    hosts = tmp_path / "hosts"
    hosts.write_text("d1:4\r\n\td2\tslots=4\nh5 slots = 2\nh7:2:3\nh9\nh10:\n")
    done = subprocess.run([os.path.join(SCRIPTS, "discover-hostfile.sh")], text=True,
                          capture_output=True, env=dict(os.environ, ELASTIC_HOSTS=str(hosts)))
    assert done.returncode == 0 and done.stdout == "d1:4\nd2:4\n", done
    left_out = [line.rsplit(": ", 1)[1] for line in done.stderr.splitlines()]
    assert left_out == ["h5 slots = 2", "h7:2:3", "h9", "h10:"], done.stderr


def test_the_hostfile_script_names_a_missing_file(tmp_path):
    done = subprocess.run([os.path.join(SCRIPTS, "discover-hostfile.sh")], text=True,
                          capture_output=True, env=dict(os.environ,
                                                        ELASTIC_HOSTS=str(tmp_path / "no")))
    assert done.returncode == 1 and "cannot read" in done.stderr and not done.stdout


def test_the_slurm_script_names_the_allocations_healthy_nodes(tmp_path):
    """scontrol and sinfo stand-ins: the allocation is n[1-3]; n2 no longer responds."""
    (tmp_path / "scontrol").write_text("#!/bin/sh\nprintf 'n1\\nn2\\nn3\\n'\n")
    (tmp_path / "sinfo").write_text(
        "#!/bin/sh\ncase \"$*\" in *--responding*) printf 'n3\\nn1\\nn1\\n';; esac\n")
    for name in ("scontrol", "sinfo"):
        os.chmod(tmp_path / name, 0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n[1-3]",
           "SLURM_GPUS_ON_NODE": "4"}
    assert _discover("discover-slurm.sh", env) == {"n1": 4, "n3": 4}
    assert _discover("discover-slurm.sh", dict(env, ELASTIC_SLOTS="2")) == {"n1": 2, "n3": 2}
    # The controller unreachable: a failure (Horovod keeps the hosts), not an empty list.
    (tmp_path / "sinfo").write_text("#!/bin/sh\necho 'slurm_load_node: timeout' >&2\nexit 1\n")
    done = subprocess.run([os.path.join(SCRIPTS, "discover-slurm.sh")], text=True,
                          capture_output=True, env=dict(os.environ, **env))
    assert done.returncode == 1 and not done.stdout and "sinfo failed" in done.stderr, done
