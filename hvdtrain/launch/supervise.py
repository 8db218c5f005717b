"""Run a set of processes as one job: merged, prefixed output; first failure ends it all."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..config import EXIT_PREEMPTED
from .remote import exit_status


@dataclass
class Member:
    """One process of the job.

    Parameters
    ----------
    name : str
        Prefix of its output lines, e.g. ``worker 1``.
    argv : list of str
        The command (an ssh command line for a remote process).
    env : dict, optional
        Its whole environment (default: the launcher's).
    essential : bool
        The job is done when every essential member exited 0 (workers); the others
        (scheduler, servers) are then given `linger` seconds to stop on their own.
    forward : str or None
        How a stop signal the launcher gets reaches this member, which then saves and stops
        (hvdtrain does, on SIGTERM, SIGINT or SIGUSR1): ``"signal"`` sends it to the member's
        process group (a worker here), ``"stdin"`` writes a stop line to its standard input
        (a worker over ssh: remote.py passes it on as SIGUSR1), ``"usr1"`` sends SIGUSR1
        (mpirun, which forwards SIGUSR1 to its ranks and kills them on TERM or INT); None:
        not at all (the scheduler and servers, which the workers still need to save).
    """

    name: str
    argv: List[str]
    env: Optional[Dict[str, str]] = None
    essential: bool = True
    forward: Optional[str] = None
    process: Optional[subprocess.Popen] = field(default=None, repr=False)


class StartError(Exception):
    """A member could not be started; the members started before it were killed."""

    def __init__(self, member: Member, error: OSError):
        super().__init__(f"cannot start {member.name or 'command'} ({member.argv[0]}): "
                         f"{error.strerror}; stopped the processes already started")
        # A shell's convention: 127 for a program not found, 126 for one that cannot run.
        self.status = 127 if isinstance(error, FileNotFoundError) else 126


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STOP_LINE = b"stop\n"  # what a worker over ssh reads on its standard input (remote.py)
REPEAT_WINDOW = 2.0  # seconds in which another signal is the first one delivered again


class Job:
    """Start `members`, stream their output, and end together.

    The job fails with the first non-zero exit status of any member, at which point every
    other member's process group is killed; a worker that stopped on request
    (:data:`EXIT_PREEMPTED`, checkpoint saved) is waited for with the other workers instead,
    so that none is killed while it saves. A first SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 is
    passed on to the workers (see :class:`Member`'s `forward`), which stop at the next step
    boundary with a checkpoint; a second one, or the first when no member takes it, kills
    them all. Each member runs in a session of its own so that whatever it starts dies with
    it.
    """

    def __init__(self, members: List[Member], linger: float = 20.0, out=None):
        self.members = members
        self.linger = linger
        self.out = out or sys.stdout.buffer
        self._lock = threading.Lock()
        self._pumps: List[threading.Thread] = []

    def _pump(self, member: Member):
        prefix = f"[{member.name}] ".encode() if member.name else b""
        for line in iter(member.process.stdout.readline, b""):
            with self._lock:
                self.out.write(prefix + line)
                self.out.flush()

    def start(self):
        """Start every member; if one cannot start, kill those already started and raise."""
        for member in self.members:
            try:
                member.process = subprocess.Popen(
                    member.argv, env=member.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as err:
                self.kill()
                raise StartError(member, err) from None
            pump = threading.Thread(target=self._pump, args=(member,), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def kill(self):
        """Kill every member's process group that is still running."""
        for member in self.members:
            if member.process and member.process.poll() is None:
                try:
                    os.killpg(member.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for member in self.members:
            if member.process:
                member.process.wait()
        for pump in self._pumps:
            pump.join(timeout=2)

    def forward(self, signum: int) -> bool:
        """Pass a stop signal on to the members that take one; whether any did."""
        passed = False
        for member in self.members:
            if member.forward is None or member.process is None or \
                    member.process.poll() is not None:
                continue
            try:
                if member.forward == "stdin":
                    member.process.stdin.write(STOP_LINE)
                    member.process.stdin.flush()
                elif member.forward == "usr1":
                    os.kill(member.process.pid, signal.SIGUSR1)
                else:
                    os.killpg(member.process.pid, signum)
                passed = True
            except (OSError, ValueError):  # it has just exited, or its stdin is closed
                pass
        return passed

    def wait(self, poll: float = 0.1) -> int:
        """Wait until the job succeeds or a member fails; return the job's exit status."""
        done_at, stopped = None, False
        while True:
            for member in self.members:
                code = member.process.poll()
                if code == EXIT_PREEMPTED and member.essential:
                    stopped = True  # saved and stopped on request: wait for the others
                elif code not in (None, 0):
                    self._say(f"{member.name or 'command'} exited with status "
                              f"{exit_status(code)}; stopping the job")
                    self.kill()
                    return exit_status(code)
            running = [m for m in self.members if m.process.poll() is None]
            if stopped and not any(m.essential for m in running):
                self._say(f"workers stopped on request (status {EXIT_PREEMPTED}); stopping "
                          f"the job")
                self.kill()
                return EXIT_PREEMPTED
            if not running:
                break
            if done_at is None and not any(m.essential for m in running):
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at > self.linger:
                self._say("workers finished; stopping " + ", ".join(m.name for m in running))
                break
            time.sleep(poll)
        self.kill()
        return 0

    def run(self) -> int:
        """Start, wait, pass a stop signal on (a second one kills the job); return the exit
        status."""
        first = []  # (signal, when) of the first stop signal

        def on_signal(signum, _frame):
            if not first and self.forward(signum):
                first.append(time.monotonic())
                self._say(f"got {signal.Signals(signum).name}: passed on to the workers, which "
                          f"save a checkpoint and stop (a second signal stops the job at once)")
                return
            if first and time.monotonic() - first[0] < REPEAT_WINDOW:
                return  # the same request delivered twice (Ctrl-C, then a supervisor)
            raise KeyboardInterrupt(signum)

        previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
        try:
            self.start()
            return self.wait()
        except StartError as err:
            self._say(str(err))
            return err.status
        except KeyboardInterrupt as interrupt:
            self._say("interrupted; stopping the job")
            self.kill()
            signum = interrupt.args[0] if interrupt.args else signal.SIGINT
            return 128 + int(signum)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _say(self, message: str):
        with self._lock:
            self.out.write(f"hvdtrain-launch: {message}\n".encode())
            self.out.flush()
