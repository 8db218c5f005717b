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
    """

    name: str
    argv: List[str]
    env: Optional[Dict[str, str]] = None
    essential: bool = True
    process: Optional[subprocess.Popen] = field(default=None, repr=False)


class StartError(Exception):
    """A member could not be started; the members started before it were killed."""

    def __init__(self, member: Member, error: OSError):
        super().__init__(f"cannot start {member.name or 'command'} ({member.argv[0]}): "
                         f"{error.strerror}; stopped the processes already started")
        # A shell's convention: 127 for a program not found, 126 for one that cannot run.
        self.status = 127 if isinstance(error, FileNotFoundError) else 126


class Job:
    """Start `members`, stream their output, and end together.

    The job fails with the first non-zero exit status of any member, at which point every
    other member's process group is killed. Ctrl-C or SIGTERM kills them all too. Each member
    runs in a session of its own so that whatever it starts dies with it.
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

    def wait(self, poll: float = 0.1) -> int:
        """Wait until the job succeeds or a member fails; return the job's exit status."""
        done_at = None
        while True:
            for member in self.members:
                code = member.process.poll()
                if code not in (None, 0):
                    self._say(f"{member.name or 'command'} exited with status "
                              f"{exit_status(code)}; stopping the job")
                    self.kill()
                    return exit_status(code)
            running = [m for m in self.members if m.process.poll() is None]
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
        """Start, wait, and clean up on Ctrl-C or SIGTERM; return the exit status."""
        def on_signal(signum, _frame):
            raise KeyboardInterrupt(signum)

        previous = signal.signal(signal.SIGTERM, on_signal)
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
            signal.signal(signal.SIGTERM, previous)

    def _say(self, message: str):
        with self._lock:
            self.out.write(f"hvdtrain-launch: {message}\n".encode())
            self.out.flush()
