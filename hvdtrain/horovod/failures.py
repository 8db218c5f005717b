"""How a ``hvdtrain.horovod`` script ends on an error it does not catch: one line, not a
traceback, where the traceback would say nothing the line does not.

``hvd.init()`` installs :func:`install`'s hook on ``sys.excepthook``, over whatever hook
was there (which still sees every other error):

- a usage error (:class:`~hvdtrain.config.ConfigError`: a ``DistributedTrainer`` argument
  hvdtrain refuses, a bad ``HVDTRAIN_*`` value) ends the rank with ``PROGRAM: error:
  MESSAGE`` and exit status 2, as the Estimator's programs do
  (:func:`hvdtrain.estimator.errors.one_line_errors`);
- Horovod's "has been shut down" (or Gloo's error for a peer killed outright) on a rank
  whose peer failed or left (the peer's own output says why) ends it with one line naming
  that peer, as far as the job's pulse saw it end first, and exit status 1;
- any error marks the session failed, so the exit makes no collective of its own.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Callable, Optional

from ..ecosystem import HOROVOD_FAILURES, HOROVOD_SHUT_DOWN
from ..estimator.errors import one_line_errors, program_name
from ..report.log import error_line

EXIT_FAILED = 1


def install(current: Callable[[], Optional[object]]) -> None:
    """Put the hook on ``sys.excepthook`` once per process; `current` returns the session
    (None before ``hvd.init`` has made it)."""
    one_line_errors()  # usage errors: one line, exit 2
    previous = sys.excepthook
    if getattr(previous, "hvdtrain_horovod", False):
        return

    def hook(kind, value, traceback):
        session = current()
        if session is not None:
            session.failed = True
        found = [m for m in HOROVOD_FAILURES if m in str(value)]  # the last: Gloo's words
        marker = found[-1] if found else None
        if marker is None:
            previous(kind, value, traceback)
            return
        error_line(f"{program_name()}: error: {peer_gone_line(session, marker)}")
        logging.shutdown()
        sys.stdout.flush()
        # Horovod's and MXNet's finalizers would wait for the peer that is gone.
        os._exit(EXIT_FAILED)  # pylint: disable=protected-access

    hook.hvdtrain_horovod = True
    sys.excepthook = hook


def peer_gone_line(session, marker: str = HOROVOD_SHUT_DOWN) -> str:
    """What ended this rank's collective: the rank(s) the job's pulse last saw end first
    (failed, or finished while this one still trained), else "another rank"; `marker`:
    Horovod's shut-down message, or Gloo's error for a peer killed outright."""
    rank = session.dist.rank if session is not None else None
    pulse = session.watchdog.pulse if session is not None else None
    ended = [r for r in (pulse.ended if pulse is not None else []) if r != rank]
    who = ("rank " + ", ".join(map(str, ended)) + (" has" if len(ended) == 1 else " have")
           if ended else "another rank has")
    here = f"rank {rank}: " if rank is not None else ""
    cause = HOROVOD_SHUT_DOWN if marker == HOROVOD_SHUT_DOWN else \
        f"a collective failed ({marker.strip(' [/')})"
    return (f"{here}{who} failed or left the job (its own output says why); "
            f"{cause}, so this rank stops too")
