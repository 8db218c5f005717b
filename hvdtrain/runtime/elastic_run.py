"""Horovod's elastic loop for MXNet workers: what ``horovod.torch.elastic.run`` does for
PyTorch, with the two things MXNet needs on top (seen in the spike, ``docs/elastic.md``).

- A failed collective does not raise ``HorovodInternalError`` in MXNet: the engine runs
  Horovod's operations asynchronously and the failure comes out of the next wait as an
  ``MXNetError`` ("Horovod has been shut down ..."). :func:`collective_errors` turns that
  into the error Horovod's ``run_fn`` rolls back on.
- A reset must let MXNet's engine drain before ``hvd.shutdown()``: work still queued would
  run its Horovod operation against a Horovod that is gone or already re-initialised.

Usage, in a worker started by ``horovodrun --min-np ... --host-discovery-script ...``::

    @elastic_run.run
    def train(state):
        while state.position.step < total:
            ...; trainer.step(batch)
            with elastic_run.collective_errors():
                mx.nd.waitall()
            ...; state.commit()
"""
from __future__ import annotations

import contextlib
import logging

import mxnet as mx
from horovod.common.elastic import run_fn
from horovod.common.exceptions import HorovodInternalError

from ..ecosystem import HOROVOD_FAILURES

log = logging.getLogger(__name__)


def is_collective_failure(err: BaseException) -> bool:
    """Whether `err` (an ``MXNetError``) is a failed Horovod collective (Horovod's and
    Gloo's messages: :data:`hvdtrain.ecosystem.HOROVOD_FAILURES`). Any other MXNetError is
    the program's own and must end it: retrying it after a rollback would only fail again,
    for ever."""
    return any(marker in str(err) for marker in HOROVOD_FAILURES)


@contextlib.contextmanager
def collective_errors():
    """Raise ``HorovodInternalError`` for an ``MXNetError`` that is a failed collective."""
    try:
        yield
    except mx.base.MXNetError as err:
        if not is_collective_failure(err):
            raise
        raise HorovodInternalError(error_summary(err)) from err


def error_summary(err: BaseException) -> str:
    """One line of an MXNet error: its first, or, when that only opens a C++ traceback
    ("Traceback (most recent call last):"), its last, which holds the message."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[-1] if "Traceback (most recent call last)" in lines[0] else lines[0]


def drain_engine():
    """Wait until MXNet's engine has run (or skipped) everything queued, and clear the
    errors it holds: the failed collectives', raised once more here, are logged.

    Until then an array that a failed operation should have written (a gradient whose
    allreduce failed, the weights of the update that read it) keeps that failure, and the
    engine skips every later write to it: a rollback writing the commit back before the
    drain would leave such arrays as the failed attempt left them. The first error raised
    clears only its own failure; others stay until ``waitall``."""
    try:
        mx.nd.waitall()
    except mx.base.MXNetError as err:
        log.warning("elastic reset: %s", error_summary(err))


def reset():
    """Drain MXNet's engine, then restart Horovod on the workers the driver now names."""
    import horovod.mxnet as hvd
    drain_engine()
    hvd.shutdown()
    hvd.init()


def run(func, around_reset=contextlib.nullcontext):
    """Decorate ``func(state, ...)`` to run under Horovod's elastic driver: rank 0's state
    is synced first; a failed collective restores the last commit, a host change keeps the
    current state; both reset Horovod and call `func` again. Each reset runs inside
    ``around_reset()`` (a context manager: the watchdog's ``busy``, as a reset waits for the
    driver's rendezvous for as long as ``--elastic-timeout``)."""
    def reset_inside():
        with around_reset():
            reset()
    return run_fn(func, reset_inside)
