"""``hvdtrain-launch``: start a parameter-server job (scheduler, servers, workers).

MXNet's ``tools/launch.py`` is not in the pip wheel; this is its replacement::

    hvdtrain-launch -n 2 -s 2 hvdtrain --kvstore dist_sync --dataset digits --no-cuda
    hvdtrain-launch -n 2 -H hostfiles/two-hosts-ps.txt --launcher ssh \\
        hvdtrain --kvstore dist_sync --data-dir ~/data/cifar-10-batches-bin

One scheduler runs where the launcher runs (with ``--launcher mpi``: on MPI rank 0); servers
and workers go round-robin over the hosts.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
from typing import Dict, List, Optional

from ..config import ConfigError
from .hostfile import Host, read_hostfile
from .remote import SCHEDULER_PROCESS, dmlc_env
from .command import command_argv
from .runner import runner_argv
from .supervise import Job, Member

# Passed to every process (remote ones too) so that a command found here is found there.
FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS")
REMOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote.py")
LOOPBACK = "127.0.0.1"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _key_value(text):
    if ":" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY:VALUE, got {text!r}")
    return tuple(text.split(":", 1))


def build_parser():
    p = _Parser(prog="hvdtrain-launch", description=(
        "Start a parameter-server job: one scheduler, the servers and the workers, on this "
        "machine or over ssh or mpirun; the first process to fail stops the whole job."))
    p.add_argument("-n", "--num-workers", type=int, required=True, help="number of workers")
    p.add_argument("-s", "--num-servers", type=int, help="number of servers (default: workers)")
    p.add_argument("-H", "--hostfile", help="hosts, one per line ('d1', 'd1:4', 'd1 slots=4')")
    p.add_argument("--launcher", choices=("local", "ssh", "mpi"),
                   help="default: ssh with a hostfile, local without")
    p.add_argument("--sync-dst-dir", help="rsync the current folder to DIR on every host first "
                                          "and run there")
    p.add_argument("--env-server", type=_key_value, action="append", default=[],
                   metavar="K:V", help="environment variable for servers")
    p.add_argument("--env-worker", type=_key_value, action="append", default=[],
                   metavar="K:V", help="environment variable for workers")
    p.add_argument("--env", action="append", default=[], metavar="NAME",
                   help="pass the launcher's NAME through to every process")
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port of the hosts")
    p.add_argument("-i", "--ssh-identity-file", help="ssh private key")
    p.add_argument("--interface", help="network interface ps-lite binds (e.g. eth0)")
    p.add_argument("--scheduler-host", help="address of this machine as the hosts reach it "
                                            "(default: found from the route to the first host)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command")
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        raise ConfigError("no worker command given (e.g. hvdtrain --kvstore dist_sync ...)")
    if args.num_workers < 1 or (args.num_servers is not None and args.num_servers < 1):
        raise ConfigError("--num-workers and --num-servers must be at least 1")
    args.num_servers = args.num_servers or args.num_workers
    args.launcher = args.launcher or ("ssh" if args.hostfile else "local")
    if args.launcher == "ssh" and not args.hostfile:
        raise ConfigError("--launcher ssh needs --hostfile")
    return args


def check_command(command: List[str], hosts: List[Host]) -> None:
    """Refuse a worker program that is not there, before anything starts.

    Only checkable here when the workers run on this machine (no hosts, or loopback ones);
    on other hosts remote.py reports a missing program and the job stops.
    """
    if hosts and not all(h.is_loopback for h in hosts):
        return
    program = command_argv(command)[0]
    if shutil.which(program) is None:
        what = "is not an executable file" if os.sep in program else "is not on PATH"
        raise ConfigError(f"worker command {program!r} not found: it {what} (a typo?)")


def free_port(host: str = "") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def scheduler_address(hosts: List[Host], override: Optional[str] = None) -> str:
    """The address the hosts reach this machine at: loopback when every host is loopback,
    otherwise the source address of the route to the first host (a UDP connect sends no
    packet)."""
    if override:
        return override
    if all(h.is_loopback for h in hosts):
        return LOOPBACK
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((hosts[0].address, 9))
        return sock.getsockname()[0]


def plan(args, hosts: List[Host], root_uri: str, root_port: int) -> List[Dict]:
    """Every process of the job: role, index, host, the variables it needs."""
    common = dict(root_uri=root_uri, root_port=root_port, num_servers=args.num_servers,
                  num_workers=args.num_workers, interface=args.interface)
    passed = {name: os.environ[name] for name in list(FORWARDED_ENV) + list(args.env)
              if name in os.environ}
    procs = [dict(role="scheduler", index=0, host=None,
                  env={**passed, **dmlc_env("scheduler", node_host=None if args.interface
                                             else root_uri, **common)})]
    for role, count, extra in (("server", args.num_servers, dict(args.env_server)),
                               ("worker", args.num_workers, dict(args.env_worker))):
        for index in range(count):
            host = hosts[index % len(hosts)] if hosts else None
            node = None if args.interface else (host.address if host else LOOPBACK)
            env = {**passed, **extra, **dmlc_env(role, node_host=node, **common)}
            procs.append(dict(role=role, index=index, host=host, env=env))
    for proc in procs:
        if proc["role"] == "worker":
            same_host = [p for p in procs if p["role"] == "worker" and p["host"] == proc["host"]]
            proc["env"]["HVDTRAIN_LOCAL_RANK"] = str(same_host.index(proc))
            proc["env"]["HVDTRAIN_LOCAL_SIZE"] = str(len(same_host))
    return procs


def ssh_base(args) -> List[str]:
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
    if args.ssh_port:
        cmd += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        cmd += ["-i", args.ssh_identity_file]
    return cmd


def remote_argv(args, proc, command, workdir) -> List[str]:
    """The ssh command that runs `command` on the process's host, dying with its ssh."""
    inner = [sys.executable, REMOTE, "--watch-stdin"]
    inner += [f"--env={k}={v}" for k, v in sorted(proc["env"].items())]
    inner += ["--"] + command
    line = f"cd {shlex.quote(workdir)} && exec " + " ".join(shlex.quote(a) for a in inner)
    return ssh_base(args) + [proc["host"].address, line]


def members(args, procs, workdir) -> List[Member]:
    out = []
    for proc in procs:
        # Servers run the user's command too, as launch.py does: ``import mxnet`` turns them
        # into servers, which can then unpickle what the workers' program defines.
        command = (SCHEDULER_PROCESS if proc["role"] == "scheduler"
                   else runner_argv(args.command))
        name = f"{proc['role']} {proc['index']}" if proc["role"] != "scheduler" else "scheduler"
        worker = proc["role"] == "worker"
        if proc["host"] is None:
            env = {**os.environ, **proc["env"]}
            out.append(Member(name, list(command), env, worker,
                              forward="signal" if worker else None))
        else:
            out.append(Member(name, remote_argv(args, proc, list(command), workdir),
                              essential=worker, forward="stdin" if worker else None))
    return out


def mpi_argv(args, hosts: List[Host], root_port: int) -> List[str]:
    """One mpirun that starts every role; remote.py picks each rank's role."""
    total = 1 + args.num_servers + args.num_workers
    cmd = ["mpirun", "--bind-to", "none", "--oversubscribe", "-np", str(total)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    root_uri = LOOPBACK
    if hosts:
        cmd += ["-H", ",".join(f"{h.address}:{h.slots}" for h in hosts)]
        root_uri = LOOPBACK if all(h.is_loopback for h in hosts) else hosts[0].address
        rsh = " ".join(ssh_base(args)[1:])
        cmd += ["--mca", "plm_rsh_args", rsh]
    for name in [n for n in FORWARDED_ENV if n in os.environ] + list(args.env):
        cmd += ["-x", name]
    for key, value in args.env_worker + args.env_server:
        cmd += ["-x", f"{key}={value}"]
    node = [] if args.interface or not root_uri.startswith("127.") else ["--node-host", LOOPBACK]
    iface = ["--interface", args.interface] if args.interface else []
    return cmd + [sys.executable, REMOTE, "--mpi-role", "--num-servers", str(args.num_servers),
                  "--num-workers", str(args.num_workers), "--root-uri", root_uri,
                  "--root-port", str(root_port)] + node + iface + ["--"] + args.command


def sync_dir(args, hosts: List[Host], dest: str) -> None:
    """rsync the current folder to `dest` on every host."""
    rsh = " ".join(shlex.quote(a) for a in ssh_base(args))
    for host in hosts:
        subprocess.run(["rsync", "-az", "--delete", "-e", rsh, "./", f"{host.address}:{dest}/"],
                       check=True)


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        hosts = read_hostfile(args.hostfile) if args.hostfile else []
        if args.launcher == "local":
            hosts = []
        check_command(args.command, hosts)
        workdir = args.sync_dst_dir or os.getcwd()
        if args.sync_dst_dir and hosts:
            sync_dir(args, hosts, args.sync_dst_dir)
        if args.launcher == "mpi":
            job = Job([Member("", mpi_argv(args, hosts, free_port()), forward="usr1")])
        else:
            root_uri = scheduler_address(hosts, args.scheduler_host) if hosts else LOOPBACK
            procs = plan(args, hosts, root_uri, free_port(root_uri))
            job = Job(members(args, procs, workdir))
    except ConfigError as err:
        print(f"hvdtrain-launch: error: {err}", file=sys.stderr)
        return 2
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"hvdtrain-launch: error: {err}", file=sys.stderr)
        return 1
    return job.run()


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())
