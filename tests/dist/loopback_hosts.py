"""Two "hosts" on loopback addresses, served by a private sshd.

Everything lives in one temporary folder: the sshd config, a throwaway client key and the
authorized_keys file. This suite never reads or writes the user's ~/.ssh: ssh takes the
port and key from the launchers' own options (horovodrun -p/-i, mpirun's plm_rsh_args,
hvdtrain-launch -p/-i). Horovod's own launcher does write ~/.ssh/known_hosts (its ssh
keeps the default), so the host key is one per machine and user, kept in the temporary
directory: a fresh key per run made a later run that drew the same port meet "REMOTE HOST
IDENTIFICATION HAS CHANGED", and ORTE could not start its daemons (a fresh clone's run,
2026-12-07, after three runs of the suite that day). Nothing listens or connects outside
127.0.0.0/8.
"""
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import List

SSHD = "/usr/sbin/sshd"
ADDRESSES = ("127.0.0.2", "127.0.0.3")
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]


@dataclass
class LoopbackHosts:
    addresses: List[str]
    port: int
    key: str
    folder: str
    distinct_hostnames: bool = False

    def ssh(self, address, command, timeout=30):
        """Run `command` on `address` over the private sshd."""
        return subprocess.run(["ssh"] + SSH_OPTIONS + ["-p", str(self.port), "-i", self.key,
                                                       address, command],
                              capture_output=True, text=True, timeout=timeout)

    def hostfile(self, slots=2, name="hostfile", fmt="{address}:{slots}"):
        path = os.path.join(self.folder, name)
        with open(path, "w") as out:
            out.write("".join(fmt.format(address=a, slots=slots) + "\n"
                              for a in self.addresses))
        return path


def _machine_host_key():
    """The private sshd's host key: made once per machine and user (see the module), by
    one test process at a time (a temporary name, then an atomic rename)."""
    folder = os.path.join(tempfile.gettempdir(), f"hvdtrain-test-sshd-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    key = os.path.join(folder, "host_key")
    if not os.path.isfile(key):
        draft = f"{key}.{os.getpid()}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", draft],
                       check=True)
        os.replace(draft + ".pub", key + ".pub")
        os.replace(draft, key)
    return key


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def loopback_hosts(folder, addresses=ADDRESSES):
    """Start sshd on `addresses`; yield a :class:`LoopbackHosts`; stop it."""
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    host_key, client_key = _machine_host_key(), os.path.join(folder, "client_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", client_key],
                   check=True)
    authorized = os.path.join(folder, "authorized_keys")
    with open(client_key + ".pub") as pub, open(authorized, "w") as out:
        out.write(pub.read())
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation folder
    named = _can_set_hostname()
    # A port found free is only free until someone else binds it (other test runs share the
    # machine): when a daemon cannot bind, start over on another one.
    for attempt in range(5):
        port = _free_port()
        log_path = os.path.join(folder, f"sshd.{attempt}.log")
        daemons = _start_daemons(folder, addresses, port, host_key, authorized, named,
                                 log_path)
        hosts = LoopbackHosts(list(addresses), port, client_key, folder, named)
        try:
            if _wait_until_up(hosts, daemons, log_path):
                yield hosts
                return
        finally:
            for daemon in daemons:
                daemon.terminate()
                daemon.wait(timeout=10)
    raise RuntimeError("private sshd could not bind a port: " + open(log_path).read())


def _start_daemons(folder, addresses, port, host_key, authorized, named, log_path):
    daemons = []
    with open(log_path, "w") as log:
        for address in addresses:
            config = os.path.join(folder, f"sshd_config.{address}")
            with open(config, "w") as out:
                out.write(f"ListenAddress {address}:{port}\nHostKey {host_key}\n"
                          f"AuthorizedKeysFile {authorized}\n"
                          f"PidFile {folder}/sshd.{address}.pid\n"
                          "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                          "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                          "LogLevel ERROR\nMaxStartups 100\nMaxSessions 100\n")
            command = [SSHD, "-D", "-e", "-f", config]
            if named:
                # Real hosts have distinct hostnames, and Open MPI names its shared-memory
                # files and session folders after them: two "hosts" sharing one name collide
                # there. The address itself is the name, so it resolves without /etc/hosts.
                command = ["unshare", "--uts", "sh", "-c", f'hostname {address} && exec "$@"',
                           "sh"] + command
            daemons.append(subprocess.Popen(command, stdout=log, stderr=log))
    return daemons


def _wait_until_up(hosts, daemons, log_path, timeout=120):
    """True once every address answers ssh; False when a daemon exited (a port taken).
    The timeout is a generous bound for a busy machine."""
    deadline = time.monotonic() + timeout
    while any(hosts.ssh(a, "true").returncode for a in hosts.addresses):
        if any(d.poll() is not None for d in daemons):
            return False
        if time.monotonic() > deadline:
            raise RuntimeError("private sshd did not come up: " + open(log_path).read())
        time.sleep(0.2)
    return True


def _can_set_hostname():
    """Whether this sandbox lets us give each "host" a hostname of its own."""
    probe = subprocess.run(["unshare", "--uts", "hostname", "probe"], capture_output=True)
    return probe.returncode == 0
