"""Writing a checkpoint while training goes on: its content copied to host memory
(:class:`HostCopy`) and one thread that writes it (:class:`BackgroundWrite`).

Training stalls only for the copy; the write (files fsynced, the folder renamed into place,
``latest`` moved, old checkpoints pruned: :func:`hvdtrain.state.checkpoint.save_checkpoint`,
unchanged) runs beside the next steps. A process killed during the write leaves a hidden
temporary folder, never a newest checkpoint that is incomplete. A write that fails (a full
disk) is kept, not raised in the thread: the training loop learns of it at the next step
boundary, on every rank at once (hvdtrain/loop/run/boundary.py), or when it waits for the write.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, Optional

import mxnet as mx

from .writes import OutputError

logger = logging.getLogger("hvdtrain")


def put_states(states: Callable[[], bytes], path: str) -> None:
    """Write ``Trainer.save_states``'s file at `path` from `states`: its bytes, or, for a
    sharded state streamed into a file of its own already (one with ``move_to``), that
    file moved there."""
    if hasattr(states, "move_to"):
        states.move_to(path)
        return
    with open(path, "wb") as out:
        out.write(states())


class HostCopy:
    """A model's arrays and its optimizer's state, copied to host memory.

    It offers what :func:`~hvdtrain.state.checkpoint.save_checkpoint` asks of a Gluon block
    and a trainer (``save_parameters``, ``_collect_params_with_prefix`` for the shapes,
    ``save_states``), so the files it writes are those a save of the live model writes.

    Parameters
    ----------
    params : dict of str to NDArray
        Every array by its place in the net (``save_parameters``'s names), on the CPU, each
        already computed (the copy waited for them).
    states : callable or None
        Returns ``Trainer.save_states``'s bytes (serialised when the write runs, from copies
        taken with the arrays); None when no optimizer state is saved.
    """

    def __init__(self, params: Dict[str, mx.nd.NDArray],
                 states: Optional[Callable[[], bytes]]):
        self.params = params
        self.states = states

    def save_parameters(self, path: str) -> None:
        mx.nd.save(path, self.params)

    def save_states(self, path: str) -> None:
        if self.states is None:
            with open(path, "wb"):
                pass
            return
        put_states(self.states, path)

    def _collect_params_with_prefix(self) -> Dict[str, mx.nd.NDArray]:
        return self.params  # each has a .shape, which is what the checkpoint's meta records


class BackgroundWrite:
    """One write running in a thread of its own; its path, or the error it met, once done.

    Parameters
    ----------
    write : callable
        Writes and returns the path written; raises :class:`OutputError` on failure.
    what : str
        What is written, for the log lines.
    """

    def __init__(self, write: Callable[[], str], what: str = "checkpoint"):
        self.what = what
        self.path: Optional[str] = None
        self.failure: Optional[OutputError] = None
        self.seconds = 0.0
        self._write = write
        self._thread = threading.Thread(target=self._run, name="hvdtrain-checkpoint-write",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            self.path = self._write()
        except OutputError as err:
            self.failure = err
        except Exception as err:  # pylint: disable=broad-except
            # Whatever else a write can raise becomes the one line a failed write prints.
            self.failure = OutputError(f"checkpoint write failed: {err}")
        self.seconds = time.perf_counter() - start
        if self.path is not None:
            logger.info("%s saved: %s (written in %.1f s in the background)", self.what,
                        self.path, self.seconds)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> str:
        """Wait for the write; return its path or raise its :class:`OutputError`."""
        self._thread.join()
        if self.failure is not None:
            raise self.failure
        return self.path
