"""What ``hvd.init()`` starts under a ``hvdtrain.horovod`` script, and what ends it at exit.

Horovod's ``init`` with the same arguments, and around it what an unchanged script gets
from hvdtrain: the Horovod store (:class:`~hvdtrain.store.kvstore.HorovodKVStore`) the
trainer exchanges its buckets through, rank-tagged log lines and Python warnings on every
rank, the stall watchdog with the job's pulse, and at exit a last replica check and a pulse
that ends with every rank's.

The settings come from the environment (a script's own flags are the script's), each read
once at ``init``:

``HVDTRAIN_STALL_TIMEOUT`` (default 600, 0: off)
    Seconds a rank waits inside hvdtrain's calls (a step, a broadcast) while no rank
    progresses and, between them, seconds of silence of the job's pulse (a peer frozen or
    dead), before every rank ends itself with one line.
``HVDTRAIN_REPLICA_CHECK`` (``resync``, ``strict`` or ``off``; default ``resync``)
    What a difference between the ranks' arrays leads to (:mod:`hvdtrain.loop.run.replica_check`).
``HVDTRAIN_REPLICA_CHECK_EVERY`` (default 500)
    Steps between two replica checks of a trainer; one more runs at exit.
"""
from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..config import ConfigError
from ..report.log import launch_rank, setup_logging
from ..runtime.pulse import JobPulse
from ..runtime.watchdog import SCRIPT_WORK, Watchdog, horovod_stall_env
from ..store.dist import DistContext
from ..store.kvstore import HorovodKVStore
from . import failures

logger = logging.getLogger("hvdtrain")

STALL_TIMEOUT_ENV = "HVDTRAIN_STALL_TIMEOUT"
REPLICA_CHECK_ENV = "HVDTRAIN_REPLICA_CHECK"
REPLICA_EVERY_ENV = "HVDTRAIN_REPLICA_CHECK_EVERY"
DEFAULTS = {STALL_TIMEOUT_ENV: "600", REPLICA_CHECK_ENV: "resync", REPLICA_EVERY_ENV: "500"}


def _setting(name: str, environ) -> str:
    return environ.get(name, DEFAULTS[name])


def _at_least_zero(name: str, kind, environ):
    """Variable `name` read as `kind`, refused unless it is a number >= 0 (a negative
    stall timeout would end every healthy job at its start, blaming a peer)."""
    text = _setting(name, environ)
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not value >= 0:  # NaN included
        raise ConfigError(f"{name}={text}: expected a number of "
                          f"{'seconds' if kind is float else 'steps'}, 0 or more (0: off)")
    return value


@dataclass
class Session:
    """This process's job under ``hvdtrain.horovod``: made by :func:`start` (``hvd.init``)."""

    dist: DistContext
    watchdog: Watchdog
    replica_policy: str
    replica_every: int
    trainers: List = field(default_factory=list)  # DistributedTrainers, checked at exit
    stores: Dict = field(default_factory=dict)  # Horovod stores by compression ("none", "fp16")
    closed: bool = False
    failed: bool = False  # the script raised an uncaught error (failures.py's hook)

    def calling(self, what: str):
        """A context for one of hvdtrain's own collectives: the watchdog watches it (the
        rank is out of the script's own work), and its end is progress."""
        return _Calling(self.watchdog, what)

    def close(self) -> None:
        """At exit: a last replica check of every trainer, then the pulse ended with every
        rank's. A failure leaves through the watchdog's one line, never a hang. Once."""
        if self.closed:
            return
        self.closed = True
        try:
            # After an uncaught error the peers may be anywhere: no collective of ours.
            for trainer in [] if self.failed else self.trainers:
                with self.calling("the replica check at exit"):
                    trainer.check_replicas("exit")
        finally:
            self.watchdog.busy_phase = None
            self.watchdog.stop(finish_pulse=not self.failed)


class _Calling:
    def __init__(self, watchdog: Watchdog, what: str):
        self.watchdog, self.what = watchdog, what

    def __enter__(self):
        self.watchdog.busy_phase = None
        return self

    def __exit__(self, exc_type, *_):
        self.watchdog.beat(self.what)
        self.watchdog.busy_phase = SCRIPT_WORK


_SESSION: List[Optional[Session]] = [None]  # Horovod's own state is process-wide too


def current() -> Session:
    """The session ``hvd.init()`` started; refused in one line before it."""
    if _SESSION[0] is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _SESSION[0]


def closing() -> None:
    """What ends the session (at ``hvd.shutdown()``, else at exit), if one was started."""
    if _SESSION[0] is not None:
        _SESSION[0].close()


def start(comm=None, process_sets=None, environ=os.environ) -> Session:
    """``hvd.init(comm, process_sets)`` with hvdtrain's store, logging and watchdog around
    it (see the module). A second call returns the first session (Horovod's own ``init``
    ignores a second call likewise)."""
    if _SESSION[0] is not None:
        return _SESSION[0]
    # First: a bad setting below is one line and exit 2, as any later usage error.
    failures.install(lambda: _SESSION[0])
    policy = _setting(REPLICA_CHECK_ENV, environ)
    if policy not in ("resync", "strict", "off"):
        raise ConfigError(f"{REPLICA_CHECK_ENV}={policy}: expected resync, strict or off")
    timeout = _at_least_zero(STALL_TIMEOUT_ENV, float, environ)
    every = _at_least_zero(REPLICA_EVERY_ENV, int, environ)
    # Before Horovod reads its variables: its stall warning matched to the timeout.
    environ.update(horovod_stall_env(timeout, environ))
    _tag_warnings(launch_rank(environ))
    if process_sets is not None:
        from horovod.mxnet import init as horovod_init  # pylint: disable=import-outside-toplevel
        horovod_init(comm=comm, process_sets=process_sets)
    # The buckets are whole flat buffers: Horovod's fusion would only copy them.
    store = HorovodKVStore(fuse_calls=False, comm=comm)
    dist = DistContext.from_store(store)
    _tag_warnings(dist.rank)
    watchdog = Watchdog(timeout, rank=dist.rank).start()
    watchdog.beat("start-up (hvd.init)")
    JobPulse.watch(watchdog, dist)
    watchdog.busy_phase = SCRIPT_WORK
    session = Session(dist, watchdog, policy, every)
    _SESSION[0] = session
    # Registered after Horovod's own shutdown: runs before it.
    atexit.register(session.close)
    return session


def _tag_warnings(rank: int) -> None:
    """hvdtrain's log lines and Python's warnings tagged with `rank`, on every rank
    (warnings through the ``py.warnings`` logger, as ``logging.captureWarnings`` sends
    them), unless the script configured Python's warnings logger itself."""
    setup_logging(rank)
    logging.captureWarnings(True)
    warned = logging.getLogger("py.warnings")
    if warned.handlers and not getattr(warned, "_hvdtrain", False):
        return
    for handler in list(warned.handlers):
        warned.removeHandler(handler)
    for handler in logging.getLogger("hvdtrain").handlers:
        warned.addHandler(handler)
    warned.setLevel(logging.WARNING)
    warned.propagate = False
    warned._hvdtrain = True  # pylint: disable=protected-access
