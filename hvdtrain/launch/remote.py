"""Run one process of a parameter-server job on behalf of ``hvdtrain-launch``.

Run by path (``python .../hvdtrain/launch/remote.py``), never as ``-m hvdtrain.launch.remote``: importing
the hvdtrain package imports MXNet, and MXNet turns into a server or scheduler at import time
when ``DMLC_ROLE`` says so. This file therefore uses the standard library only, and sets the
role variables for its child alone.

It starts the command in a session of its own and

- with ``--watch-stdin``, kills that session when its standard input closes: a command
  started over ssh then dies with the launcher's ssh client instead of outliving it; a
  ``stop`` line on it (hvdtrain-launch passing on a stop signal) reaches a worker as SIGUSR1;
- passes SIGUSR1 on to a worker (mpirun forwards it to its ranks): hvdtrain saves a
  checkpoint and stops on it; TERM, INT and HUP kill the command (its handlers are in place
  before the command starts, so a signal in between is not lost);
- on Linux, has the kernel SIGKILL the command when this process dies without its handlers
  running: mpirun SIGKILLs its ranks one second after its TERM, and a ``remote.py`` starved of
  CPU for that second would otherwise leave its command (a server or scheduler waits forever)
  running in its own session;
- with ``--mpi-role``, takes its role from its MPI rank (0: scheduler, 1..S: servers, the
  rest: workers) before MXNet is imported, and prefixes its output with that role; servers
  and workers run the command through ``runner.py``, as the launcher does for the others;
- exits with the command's status (128 + N when killed by signal N).
"""
import argparse
import os
import signal
import subprocess
import sys
import threading

# The scheduler runs no user code: MXNet alone. Servers and workers run the user's command
# through runner.py (beside this file).
SCHEDULER_PROCESS = [sys.executable, "-c", "import mxnet"]
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
_PR_SET_PDEATHSIG = 1  # Linux's prctl option (command.py's too: this file imports no sibling)


def dmlc_env(role, root_uri, root_port, num_servers, num_workers, node_host=None,
             interface=None):
    """The ``DMLC_*`` variables one parameter-server process needs.

    ps-lite advertises the first non-loopback address unless told otherwise, so loopback
    jobs must pass `node_host` (or `interface`).
    """
    env = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": root_uri, "DMLC_PS_ROOT_PORT": str(root_port),
           "DMLC_NUM_SERVER": str(num_servers), "DMLC_NUM_WORKER": str(num_workers)}
    if node_host:
        env["DMLC_NODE_HOST"] = node_host
    if interface:
        env["DMLC_INTERFACE"] = interface
    return env


def mpi_role(rank, num_servers):
    """(role, index) of MPI rank `rank`: one scheduler, then servers, then workers."""
    if rank == 0:
        return "scheduler", 0
    if rank <= num_servers:
        return "server", rank - 1
    return "worker", rank - 1 - num_servers


def exit_status(returncode):
    """A shell-style exit status for a Popen return code."""
    return 128 - returncode if returncode < 0 else returncode


def _mpi_rank(environ):
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if name in environ:
            return int(environ[name])
    raise SystemExit("remote.py --mpi-role: not started by mpirun (no OMPI_COMM_WORLD_RANK)")


def _parse(argv):
    p = argparse.ArgumentParser(prog="hvdtrain/launch/remote.py")
    p.add_argument("--watch-stdin", action="store_true")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set for the child only")
    p.add_argument("--mpi-role", action="store_true")
    p.add_argument("--num-servers", type=int)
    p.add_argument("--num-workers", type=int)
    p.add_argument("--root-uri")
    p.add_argument("--root-port", type=int)
    p.add_argument("--node-host")
    p.add_argument("--interface")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("no command given")
    return args


def _die_with_this_process():
    """A ``preexec_fn`` that makes the child receive SIGKILL when this process dies (Linux's
    ``PR_SET_PDEATHSIG``, kept across exec), or None where that does not exist.

    Safe as a ``preexec_fn`` because it runs before this process starts any thread."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # pylint: disable=import-outside-toplevel
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # this process died before the prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def _pump(stream, prefix):
    for line in iter(stream.readline, b""):
        sys.stdout.buffer.write(prefix + line)
        sys.stdout.buffer.flush()


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.env)
    command, prefix = args.command, None
    if args.mpi_role:
        role, index = mpi_role(_mpi_rank(env), args.num_servers)
        env.update(dmlc_env(role, args.root_uri, args.root_port, args.num_servers,
                            args.num_workers, args.node_host, args.interface))
        if role == "scheduler":
            command = SCHEDULER_PROCESS
        else:
            command = [sys.executable, RUNNER, "--"] + command
        prefix = f"[{role} {index}] ".encode()
    started = []  # the child, once it exists
    pending = []  # what a signal asked for before then

    def signal_child(signum, action):
        if not started:
            pending.append(action)
            return
        try:
            os.killpg(started[0].pid, signum)
        except ProcessLookupError:
            pass

    def kill_child(*_):
        signal_child(signal.SIGKILL, kill_child)

    def ask_to_stop(*_):
        if env.get("DMLC_ROLE") == "worker":  # a server or the scheduler would just die
            signal_child(signal.SIGUSR1, ask_to_stop)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, kill_child)
    signal.signal(signal.SIGUSR1, ask_to_stop)
    try:
        child = subprocess.Popen(command, env=env, start_new_session=True,
                                 stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE if prefix else None,
                                 stderr=subprocess.STDOUT if prefix else None,
                                 preexec_fn=_die_with_this_process())
    except OSError as err:
        print(f"hvdtrain/launch/remote.py on {os.uname().nodename}: cannot run {command[0]}: "
              f"{err.strerror}", file=sys.stderr)
        return 127
    started.append(child)
    for action in pending:
        action()
    if args.watch_stdin:
        def watch():
            # os.read, not sys.stdin: a buffered reader's lock held by this thread would
            # abort the interpreter at shutdown.
            while True:
                data = os.read(0, 4096)
                if not data:
                    break
                if b"stop" in data:
                    ask_to_stop()
            kill_child()
        threading.Thread(target=watch, daemon=True).start()
    if prefix:
        _pump(child.stdout, prefix)
    return exit_status(child.wait())


if __name__ == "__main__":
    sys.exit(main())
