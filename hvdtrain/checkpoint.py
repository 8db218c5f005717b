"""Crash-safe checkpoints: written by rank 0 alone, loaded by every rank.

Layout under the output folder::

    checkpoints/epoch-0003/model.params     parameters (Gluon save_parameters)
                          trainer.states   optimizer state (Trainer.save_states)
                          meta.json        written last: epoch, step, config, shapes, ...
    checkpoints/latest                     name of the newest complete checkpoint

A checkpoint is assembled in a hidden temporary folder, every file fsynced, then renamed into
place, and only then does ``latest`` move (itself by an atomic rename). A crash at any moment
leaves the previous checkpoint intact; a half-written folder is never named ``epoch-*``, and
readers skip any checkpoint without a readable ``meta.json``.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from typing import Dict, List, Optional

from .config import ConfigError
from .writes import atomic_write, fsync_path as _fsync_path, write_failure

CHECKPOINTS = "checkpoints"
LATEST = "latest"
META = "meta.json"
PARAMS = "model.params"
STATES = "trainer.states"
_NAME = re.compile(r"^epoch-(\d{4,})$")

logger = logging.getLogger("hvdtrain")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used; the message says which and why."""


def save_params(net, path: str) -> str:
    """Save `net`'s parameters (Gluon ``save_parameters`` format) atomically to `path`."""
    return atomic_write(path, net.save_parameters)


def param_shapes(net) -> Dict[str, List[int]]:
    """Parameter name (as ``save_parameters`` writes it) to shape."""
    return {name: list(p.shape) for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def save_checkpoint(output_dir: str, net, trainer, meta: Dict, keep: int,
                    with_states: bool = True) -> str:
    """Write checkpoint ``epoch-<meta['epoch']>`` and keep the newest `keep` ones.

    Parameters
    ----------
    meta : dict
        Must hold ``epoch`` (epochs completed); saved as ``meta.json`` with the shapes.
    with_states : bool
        False when the optimizer runs on parameter servers (``dist_async``).
    """
    folder = os.path.join(output_dir, CHECKPOINTS)
    os.makedirs(folder, exist_ok=True)
    name = f"epoch-{meta['epoch']:04d}"
    tmp = os.path.join(folder, f".tmp-{name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_folder(tmp, net, trainer, dict(meta, param_shapes=param_shapes(net),
                                              has_states=with_states), with_states)
    except Exception as err:  # a full disk shows up as OSError or MXNetError
        failure = write_failure(tmp, err)
        shutil.rmtree(tmp, ignore_errors=True)  # else it keeps the disk full
        raise failure from None
    final = os.path.join(folder, name)
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
    return final


def _write_folder(tmp: str, net, trainer, meta: Dict, with_states: bool) -> None:
    """Write and fsync every file of a checkpoint into the new folder `tmp`."""
    os.makedirs(tmp)
    net.save_parameters(os.path.join(tmp, PARAMS))
    if with_states:
        trainer.save_states(os.path.join(tmp, STATES))
    with open(os.path.join(tmp, META), "w", encoding="utf-8") as out:
        json.dump(meta, out, indent=1, sort_keys=True)
    for entry in os.listdir(tmp):
        _fsync_path(os.path.join(tmp, entry))
    _fsync_path(tmp)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)


def complete_checkpoints(folder: str) -> List[str]:
    """Complete ``epoch-*`` checkpoints in `folder`, oldest first."""
    if not os.path.isdir(folder):
        return []
    names = sorted((n for n in os.listdir(folder) if _NAME.match(n)),
                   key=lambda n: int(_NAME.match(n).group(1)))
    return [os.path.join(folder, n) for n in names if is_complete(os.path.join(folder, n))]


def prune(folder: str, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints, and leftovers of crashes."""
    for old in complete_checkpoints(folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for entry in os.listdir(folder):
        if entry.startswith((".tmp-epoch-", ".old-epoch-", f".{LATEST}.tmp-")) and \
                not entry.endswith(f"-{os.getpid()}"):
            leftover = os.path.join(folder, entry)
            if os.path.isdir(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                os.remove(leftover)


def is_complete(path: str) -> bool:
    """Whether `path` holds a checkpoint whose files were all written."""
    try:
        meta = read_meta(path)
    except CheckpointError:
        return False
    needed = [PARAMS] + ([STATES] if meta.get("has_states") else [])
    return all(os.path.isfile(os.path.join(path, f)) for f in needed)


def read_meta(path: str) -> Dict:
    """The ``meta.json`` of checkpoint `path`."""
    try:
        with open(os.path.join(path, META), encoding="utf-8") as src:
            meta = json.load(src)
        int(meta["epoch"]), int(meta["step"])
        return meta
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} is incomplete or corrupt: cannot read "
                              f"{META} ({err.__class__.__name__})") from None


def latest_checkpoint(folder: str) -> Optional[str]:
    """The newest complete checkpoint under `folder` (an output folder, its
    ``checkpoints`` folder, or None when there is none)."""
    if os.path.isdir(os.path.join(folder, CHECKPOINTS)):
        folder = os.path.join(folder, CHECKPOINTS)
    try:
        with open(os.path.join(folder, LATEST), encoding="utf-8") as src:
            pointed = os.path.join(folder, src.read().strip())
        if _NAME.match(os.path.basename(pointed)) and is_complete(pointed):
            return pointed
    except OSError:
        pass
    found = complete_checkpoints(folder)
    return found[-1] if found else None


def resolve_resume(resume: Optional[str], output_dir: Optional[str]) -> Optional[str]:
    """The checkpoint `--resume` names: ``auto`` is the newest in `output_dir` (None if
    there is none); a path is a checkpoint folder or a folder holding checkpoints."""
    if not resume:
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir) if output_dir else None
    if not os.path.exists(resume):
        raise CheckpointError(f"--resume {resume} does not exist")
    if os.path.exists(os.path.join(resume, META)) or os.path.exists(os.path.join(resume, PARAMS)):
        read_meta(resume)
        if not is_complete(resume):
            raise CheckpointError(f"checkpoint {resume} is incomplete: files are missing")
        return resume
    found = latest_checkpoint(resume)
    if found is None:
        raise CheckpointError(f"--resume {resume} holds no complete checkpoint")
    return found


def restore(path: str, net, trainer, devices) -> Dict:
    """Load checkpoint `path` into `net` and `trainer`; return its metadata.

    Shapes are compared first, so a checkpoint of another model or dataset is refused with
    the first mismatching parameter named.
    """
    meta = read_meta(path)
    saved = meta.get("param_shapes", {})
    current = param_shapes(net)
    if set(saved) != set(current):
        extra = sorted(set(saved) ^ set(current))[:3]
        raise CheckpointError(f"checkpoint {path} is from another model "
                              f"({meta.get('model')}): parameters differ, e.g. {extra}")
    for name, shape in current.items():
        if list(saved[name]) != shape:
            raise CheckpointError(f"checkpoint {path} does not fit this model: {name} has "
                                  f"shape {tuple(saved[name])} there, {tuple(shape)} here "
                                  f"(model {meta.get('model')}, dataset {meta.get('dataset')})")
    try:
        net.load_parameters(os.path.join(path, PARAMS), ctx=devices)
        if meta.get("has_states") and trainer is not None:
            trainer.load_states(os.path.join(path, STATES))
    except Exception as err:  # MXNet reports corrupt files as many exception types
        first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
        raise CheckpointError(f"checkpoint {path} is corrupt: {first}") from None
    return meta


class Checkpointer:
    """Save a checkpoint every `every` epochs (and after the last one) on the root rank.

    Parameters
    ----------
    output_dir : str or None
        None (or ``enabled=False``, on every rank but the root) turns saving off.
    meta : dict
        What every checkpoint records besides epoch and step (config, world size, ...).
    with_states : bool
        Whether the trainer's optimizer state can be saved (not under ``dist_async``).
    """

    def __init__(self, output_dir: Optional[str], every: int = 1, keep: int = 3,
                 enabled: bool = True, meta: Optional[Dict] = None, with_states: bool = True):
        self.output_dir = output_dir if enabled else None
        self.every = every
        self.keep = keep
        self.meta = dict(meta or {})
        self.with_states = with_states

    def after_epoch(self, net, trainer, state, last: bool = False) -> Optional[str]:
        """Save if this epoch is due; `state` has ``epoch`` (completed) and ``step``."""
        if self.output_dir is None or not (last or state.epoch % self.every == 0):
            return None
        path = save_checkpoint(self.output_dir, net, trainer,
                               dict(self.meta, epoch=state.epoch, step=state.step),
                               self.keep, self.with_states)
        logger.info("checkpoint saved: %s", path)
        return path
