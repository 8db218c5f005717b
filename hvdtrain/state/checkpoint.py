"""Crash-safe checkpoints: written by rank 0 alone (the layout: :mod:`.checkpoint_files`).

A checkpoint is assembled in a hidden temporary folder, every file fsynced, then renamed into
place, and only then does ``latest`` move (itself by an atomic rename). Pruning renames a
checkpoint to a hidden name before deleting it. A crash at any moment leaves the previous
checkpoint intact; a half-written or half-deleted folder is never a complete ``epoch-*``
checkpoint, and :func:`clear_leftovers` removes what such crashes leave.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from typing import Callable, Dict, List, Optional, Tuple

import mxnet as mx

from .checkpoint_files import (CHECKPOINTS, DIGESTS, LATEST, META, NAME_PATTERN, PARAMS,
                               STATES, checkpoint_name, complete_checkpoints, file_digest,
                               missing_files, param_shapes)
from . import compression_state
from .background import BackgroundWrite, put_states
from .writes import atomic_write, fsync_path as _fsync_path, write_failure

# What an interrupted save or prune leaves behind (never named epoch-*).
_LEFTOVER_PREFIXES = (".tmp-epoch-", ".old-epoch-", f".{LATEST}.tmp-")

logger = logging.getLogger("hvdtrain")


def holds_slices(trainer) -> bool:
    """Whether each rank holds a slice of `trainer`'s optimizer state (``shard_optimizer``):
    a save then needs :func:`gathered_states` on every rank first."""
    return hasattr(trainer, "whole_states_later")


def gathered_states(trainer, into: Optional[str] = None) -> Optional[Callable[[], bytes]]:
    """Every rank, before a save: the optimizer state of a trainer whose ranks each hold a
    slice of it, gathered on rank 0 (a collective; None on the other ranks, which only send
    their slices) and there streamed into the file `into` as it arrives (given: it is moved
    into the checkpoint when that is written); None for any other trainer (rank 0 copies
    its own state when it saves)."""
    if not holds_slices(trainer):
        return None
    return trainer.whole_states_later(to_root=True, into=into)


class _StatesOnly:
    """What a synchronous save asks of a trainer, from states gathered already."""

    def __init__(self, states: Callable[[], bytes]):
        self._states = states

    def save_states(self, path: str) -> None:
        put_states(self._states, path)


def save_params(net, path: str) -> str:
    """Save `net`'s parameters (Gluon ``save_parameters`` format) atomically to `path`."""
    return atomic_write(path, net.save_parameters)


def save_checkpoint(output_dir: str, net, trainer, meta: Dict, keep: int,
                    with_states: bool = True, compression: Optional[Dict] = None,
                    files: Optional[Dict[str, Dict]] = None) -> str:
    """Write a checkpoint named after `meta`'s position and keep the newest `keep` ones.

    Parameters
    ----------
    meta : dict
        Must hold ``epoch`` (epochs completed) and ``step``; ``epoch_samples`` marks a stop
        inside the next epoch. Saved as ``meta.json`` with the shapes.
    with_states : bool
        False when the optimizer runs on parameter servers (``dist_async``).
    compression : dict, optional
        PowerSGD's state, gathered on every rank (:func:`.compression_state.gather`).
    files : dict of str to dict of str to NDArray, optional
        More files of the checkpoint, each a set of named arrays in ``save_parameters``
        format (the EMA's ``ema.params``); their names are listed in ``meta.json``
        (``files``), so that a checkpoint missing one is incomplete.
    """
    files = dict(files or {})
    folder = os.path.join(output_dir, CHECKPOINTS)
    os.makedirs(folder, exist_ok=True)
    clear_leftovers(folder)
    name = checkpoint_name(meta["epoch"], meta["step"], meta.get("epoch_samples", 0))
    tmp = os.path.join(folder, f".tmp-{name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_folder(tmp, net, trainer, dict(meta, param_shapes=param_shapes(net),
                                              has_states=with_states,
                                              has_compression_state=compression is not None,
                                              files=sorted(files)),
                      with_states, compression, files)
    except Exception as err:  # a full disk shows up as OSError or MXNetError
        failure = write_failure(tmp, err)
        shutil.rmtree(tmp, ignore_errors=True)  # else it keeps the disk full
        raise failure from None
    final = os.path.join(folder, name)
    try:
        _put_in_place(folder, tmp, final, name, keep)
    except OSError as err:
        # A rename, an fsync or a prune that fails (EIO, EROFS, a quota) is a failed write
        # like any other, one line (OutputError): a synchronous save (--elastic) raises it to
        # write_together, which makes it every rank's stop, instead of rank 0's alone.
        failure = write_failure(final, err)
        shutil.rmtree(tmp, ignore_errors=True)
        raise failure from None
    return final


def _put_in_place(folder: str, tmp: str, final: str, name: str, keep: int) -> None:
    """Rename the written checkpoint `tmp` to `final`, move ``latest`` to it, prune."""
    stale = None
    if os.path.exists(final):  # a resumed run redoing this epoch: move the old one aside
        stale = os.path.join(folder, f".old-{name}-{os.getpid()}")
        os.rename(final, stale)
    os.rename(tmp, final)
    _fsync_path(folder)
    atomic_write(os.path.join(folder, LATEST), lambda p: _write_text(p, name + "\n"))
    if stale:
        shutil.rmtree(stale, ignore_errors=True)
    prune(folder, keep)


def _write_folder(tmp: str, net, trainer, meta: Dict, with_states: bool,
                  compression: Optional[Dict], files: Dict[str, Dict]) -> None:
    """Write and fsync every file of a checkpoint into the new folder `tmp`."""
    os.makedirs(tmp)
    net.save_parameters(os.path.join(tmp, PARAMS))
    if with_states:
        trainer.save_states(os.path.join(tmp, STATES))
    compression_state.write(tmp, compression)
    for name, arrays in files.items():
        mx.nd.save(os.path.join(tmp, name), arrays)
    # Each file's digest: a file changed in place later (not only cut short) is then known
    # as damaged at resume, and passed over, instead of loaded.
    meta = dict(meta, **{DIGESTS: {entry: file_digest(os.path.join(tmp, entry))
                                   for entry in sorted(os.listdir(tmp))}})
    with open(os.path.join(tmp, META), "w", encoding="utf-8") as out:
        json.dump(meta, out, indent=1, sort_keys=True)
    for entry in os.listdir(tmp):
        _fsync_path(os.path.join(tmp, entry))
    _fsync_path(tmp)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)


def prune(folder: str, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints.

    Each is renamed out of the ``epoch-*`` namespace first, so a crash mid-delete leaves a
    leftover (cleared by the next save or start), never a half-deleted checkpoint."""
    for old in complete_checkpoints(folder)[:-keep]:
        doomed = os.path.join(folder, f".old-{os.path.basename(old)}-{os.getpid()}")
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def clear_leftovers(folder: str) -> List[str]:
    """Remove what interrupted saves and prunes left in `folder`: temporary folders and
    files, and ``epoch-*`` folders missing a file (a delete cut short). Call it only while
    holding the output folder (see :mod:`hvdtrain.state.run_dir`): another run's save in progress
    looks the same. Returns the names removed."""
    removed = []
    if not os.path.isdir(folder):
        return removed
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if not (entry.startswith(_LEFTOVER_PREFIXES) or (NAME_PATTERN.match(entry) and
                                                          missing_files(path))):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
        removed.append(entry)
    return removed


class Checkpointer:
    """Rank 0's checkpoints: every `every` epochs (and after the last one), and whenever the
    training loop asks (:meth:`save`: a step or time interval, a stop).

    Parameters
    ----------
    output_dir : str or None
        None (or ``enabled=False``, on every rank but the root) turns saving off.
    every : int or None
        Epochs between the saves at epoch ends; None: none but those asked for.
    meta : dict
        What every checkpoint records besides epoch and step (config, world size, ...).
    with_states : bool
        Whether the trainer's optimizer state can be saved (not under ``dist_async``).
    host_copy : callable, optional
        ``host_copy(net, trainer, with_states, replace)`` returns a
        :class:`~hvdtrain.state.background.HostCopy` (`replace`: arrays by name to save
        instead of the net's own). Given, a save copies to host memory and writes in the
        background, one write at a time; without, it writes before returning.
    """

    def __init__(self, output_dir: Optional[str], every: Optional[int] = 1, keep: int = 3,
                 enabled: bool = True, meta: Optional[Dict] = None, with_states: bool = True,
                 host_copy: Optional[Callable] = None):
        self.output_dir = output_dir if enabled else None
        self.every = every
        self.keep = keep
        self.meta = dict(meta or {})
        self.with_states = with_states
        self.host_copy = host_copy
        self.saving = output_dir is not None  # on every rank: the run saves checkpoints
        # State outside the optimizer's file, e.g. AMP's loss scale: trainer -> dict.
        self.extra: Callable[[object], Dict] = lambda trainer: {}
        self.compression: Optional[Dict] = None  # what gather() collected for the next save
        self.states: Optional[Callable[[], bytes]] = None  # so: a sharded optimizer state
        # More files of each checkpoint, e.g. the EMA's: name -> copy() returning the named
        # arrays to save, copied to host memory (they are written in the background).
        self.files: Dict[str, Callable[[], Dict]] = {}
        self._write: Optional[BackgroundWrite] = None

    def due(self, state, last: bool = False) -> bool:
        """Whether :meth:`after_epoch` saves after `state` (the same answer on every
        rank)."""
        return self.saving and bool(last or (self.every and state.epoch % self.every == 0))

    def gather(self, trainer, due: bool = True) -> None:
        """On every rank, before a save that is `due`: what it needs from all ranks
        (PowerSGD's errors, summed over them; a sharded optimizer state, gathered whole on
        rank 0),
        kept for the save."""
        due = due and self.saving
        self.compression = compression_state.gather(trainer) if due else None
        into = None
        if due and self.output_dir is not None:  # rank 0: a file beside the checkpoints
            os.makedirs(self.output_dir, exist_ok=True)
            into = os.path.join(self.output_dir,
                                f".states-{os.getpid()}-{uuid.uuid4().hex}.part")
        self.states = gathered_states(trainer, into) if due and self.with_states else None

    def after_epoch(self, net, trainer, state, last: bool = False) -> Optional[str]:
        """Save if this epoch is due (or `last`); `state` has ``epoch`` (completed),
        ``step`` and ``epoch_samples`` (inside the next epoch). A trainer that compresses
        needs :meth:`gather` first, on every rank."""
        if not self.due(state, last):
            return None
        return self.save(net, trainer, state)

    def save(self, net, trainer, state, replace: Optional[Dict] = None,
             files: Optional[Dict[str, Dict]] = None) -> Optional[str]:
        """Save the checkpoint of `state`'s position (None when saving is off) and return
        its path; in the background with a `host_copy`, once the write before it is done
        (whose failure this raises). `replace`: see `host_copy`; `files`: copies to save
        instead of what :attr:`files` copies. A trainer that compresses needs :meth:`gather`
        first, on every rank."""
        if self.output_dir is None:
            return None
        compression, self.compression = self.compression, None
        states, self.states = self.states, None
        if compression is None and compression_state.compression_of(trainer) is not None:
            raise RuntimeError("a checkpoint of a compressing trainer needs gather() first, "
                               "on every rank")
        if states is None and self.with_states and holds_slices(trainer):
            raise RuntimeError("a checkpoint of a sharded optimizer state needs gather() "
                               "first, on every rank")
        self.wait()
        files = files if files is not None else {
            name: copy() for name, copy in self.files.items()}
        samples = getattr(state, "epoch_samples", 0)
        meta = dict(self.meta, epoch=state.epoch, step=state.step, epoch_samples=samples,
                    epoch_skipped=getattr(state, "epoch_skipped", 0) if samples else 0,
                    **self.extra(trainer))
        if self.host_copy is None:
            start = time.perf_counter()
            path = save_checkpoint(self.output_dir, net,
                                   trainer if states is None else _StatesOnly(states), meta,
                                   self.keep, self.with_states, compression, files)
            logger.info("checkpoint saved: %s (written in %.1f s)", path,
                        time.perf_counter() - start)
            return path
        copy = self.host_copy(net, trainer, self.with_states, replace, states)
        # save_checkpoint is looked up when the thread runs (a test shim may wrap it).
        self._write = BackgroundWrite(lambda: save_checkpoint(
            self.output_dir, copy, copy, meta, self.keep, self.with_states, compression,
            files))
        return os.path.join(self.output_dir, CHECKPOINTS,
                            checkpoint_name(state.epoch, state.step, samples))

    def wait(self) -> Optional[str]:
        """Wait for the write in progress, if any: its path, or its failure raised (once)."""
        write, self._write = self._write, None
        return write.join() if write is not None else None

    def write_status(self) -> Tuple[bool, bool]:
        """(failed, busy) of the background write, read together: whether it has ended in a
        failure not yet raised, and whether it is still running. The thread's liveness is
        read once, first: a write that ends (and fails) while these are read is then seen
        as busy, and its failure at the next read, never as done without a failure (two
        separate reads of :attr:`failed` and :attr:`writing` could see both false)."""
        write = self._write
        if write is None:
            return False, False
        busy = write.running
        return (not busy and write.failure is not None), busy

    @property
    def writing(self) -> bool:
        """Whether a background write is still running."""
        return self._write is not None and self._write.running

    @property
    def failed(self) -> bool:
        """Whether the last background write has ended in a failure not yet raised."""
        return self._write is not None and not self._write.running and \
            self._write.failure is not None
