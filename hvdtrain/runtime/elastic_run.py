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

log = logging.getLogger(__name__)

# What MXNet reports when a Horovod operation queued in its engine failed (every failure the
# spike saw, 21 of 21, on Horovod 0.28.1). Any other MXNetError is the program's own and
# must end it: retrying it after a rollback would only fail again, for ever.
HOROVOD_FAILURE = "Horovod has been shut down"


@contextlib.contextmanager
def collective_errors():
    """Raise ``HorovodInternalError`` for an ``MXNetError`` that is a failed collective."""
    try:
        yield
    except mx.base.MXNetError as err:
        if HOROVOD_FAILURE not in str(err):
            raise
        raise HorovodInternalError(str(err).splitlines()[0]) from err


def reset():
    """Drain MXNet's engine, then restart Horovod on the workers the driver now names."""
    import horovod.mxnet as hvd
    try:
        mx.nd.waitall()
    except mx.base.MXNetError as err:  # the failed collective's error, raised once more
        log.warning("elastic reset: %s", str(err).splitlines()[0])
    hvd.shutdown()
    hvd.init()


def run(func):
    """Decorate ``func(state, ...)`` to run under Horovod's elastic driver: rank 0's state
    is synced first; a failed collective restores the last commit, a host change keeps the
    current state; both reset Horovod and call `func` again."""
    return run_fn(func, reset)
