"""The lock that makes an output folder belong to one run at a time.

Rank 0 holds an ``fcntl`` lock on ``<output-dir>/.hvdtrain.lock`` while the run lives, so a
second run into the same folder is refused instead of deleting the first one's temporary
checkpoint and mixing its lines into ``metrics.jsonl``. The kernel drops the lock when the
process ends, however it ends (``kill -9`` included), so a crash never leaves it stuck.
:class:`~hvdtrain.state.run_dir.RunDir` probes it at decide and takes it at claim.

Every rank of a launch probes the folder at about the same moment, and rank 0 takes the
lock meanwhile: a probe takes a shared lock for an instant (probes never block each other),
and a lock found busy is looked at again for up to :data:`SETTLE_S` before it counts as
another run's. A run holds it for its life; a probe, or a rank 0 that has taken it but not
yet written its line, for microseconds. (Probing with the exclusive lock once made a resume
refuse itself by chance: one rank's probe was another's "holder", and the file still named
the run before.)
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from typing import Optional

LOCK_FILE = ".hvdtrain.lock"
SETTLE_S = 2.0  # how long a busy lock is looked at again before it counts as held
_POLL_S = 0.05


def elastic_job(environ=os.environ) -> Optional[str]:
    """The elastic job this process belongs to (its Horovod rendezvous ``ADDR:PORT``), or
    None outside Horovod's elastic driver. A worker that joins a running elastic job finds
    the folder locked by that same job's rank 0: this tells it apart from another run."""
    if environ.get("HOROVOD_ELASTIC") != "1":
        return None
    addr = environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    return f"{addr}:{port}" if addr and port else None


def launch_of(environ=os.environ) -> Optional[str]:
    """What names this process's launch, the same on each of its ranks and different for
    another launch: the Gloo rendezvous (``horovodrun --gloo``, elastic), Open MPI's
    ``mpirun`` (its URI), or the parameter server's scheduler; None for a lone process.

    Every rank probes the folder before rank 0 takes the lock, with no collective between:
    a rank that starts late (a loaded host, a far one) finds the lock already held by its
    own launch's rank 0, and must not take that for another run (seen in ``make test``)."""
    addr = environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if addr and port:
        return f"gloo {addr}:{port}"
    if environ.get("OMPI_MCA_orte_hnp_uri"):
        return f"mpirun {environ['OMPI_MCA_orte_hnp_uri']}"
    addr, port = environ.get("DMLC_PS_ROOT_URI"), environ.get("DMLC_PS_ROOT_PORT")
    if addr and port:
        return f"scheduler {addr}:{port}"
    return None


class OutputLock:
    """Rank 0's exclusive claim on an output folder (``flock``, non-blocking)."""

    def __init__(self, output_dir: str, job: Optional[str] = None,
                 launch: Optional[str] = None):
        self.output_dir = output_dir
        self.job = job  # elastic_job(): workers of one elastic job share the folder
        self.launch = launch  # launch_of(): so do the ranks of one launch
        self.path = os.path.join(output_dir, LOCK_FILE)
        self._file = None

    def acquire(self, settle: float = SETTLE_S) -> bool:
        """Take the lock; False if another process still holds it after `settle` seconds
        (another rank's probe holds it for an instant)."""
        handle = open(self.path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
        deadline = time.monotonic() + settle
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.close()
                    return False
                time.sleep(_POLL_S)
        handle.seek(0)
        handle.truncate()
        job = f" (elastic job {self.job})" if self.job else \
            f" (launch {self.launch})" if self.launch else ""
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}{job}\n")
        handle.flush()
        self._file = handle
        return True

    def held_by_another(self, settle: float = SETTLE_S) -> Optional[str]:
        """Who holds the lock, if a process of another job or launch still does after
        `settle` seconds (see the module); the file is left as it is."""
        try:
            probe = open(self.path, encoding="utf-8")  # pylint: disable=consider-using-with
        except OSError:
            return None
        deadline = time.monotonic() + settle
        with probe:
            while True:
                try:
                    fcntl.flock(probe.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = self.holder()
                    if self._ours(holder):
                        return None
                    if time.monotonic() >= deadline:
                        return holder
                    time.sleep(_POLL_S)
                    continue
                fcntl.flock(probe.fileno(), fcntl.LOCK_UN)
                return None

    def _ours(self, holder: str) -> bool:
        """Whether `holder` (its line) is this elastic job's or this launch's rank 0, which
        got here first."""
        return bool(self.job and holder.endswith(f"(elastic job {self.job})")
                    or self.launch and holder.endswith(f"(launch {self.launch})"))

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it."""
        try:
            with open(self.path, encoding="utf-8") as src:
                lines = [line.strip() for line in src if line.strip()]
            return lines[-1] if lines else "another process"  # "pid N on HOST"
        except OSError:
            return "another process"

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
