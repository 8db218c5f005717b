"""Which checkpoint ``--resume`` means, and loading one.

``--resume auto`` (or a folder) names the complete checkpoints best first: the one ``latest``
points at, then the others newest first, each with its ``meta.json`` read (and validated)
once. Interrupted saves (files missing) are not checkpoints; damaged ones (an invalid
``meta.json``) are passed over with a warning while an older one remains, and refused in one
line otherwise. A parameter file that does not load shows only when :func:`restore` loads it.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

from . import compression_state
from .checkpoint_files import (CHECKPOINTS, LATEST, META, PARAMS, STATES, CheckpointError,
                         changed_files, checkpoint_order, missing_files, named_checkpoints,
                         param_shapes, read_meta)

logger = logging.getLogger("hvdtrain")


@dataclass(frozen=True)
class Candidate:
    """A complete checkpoint a resume may continue from, with its validated metadata."""

    path: str
    meta: Dict


def _checkpoints_folder(folder: str) -> str:
    sub = os.path.join(folder, CHECKPOINTS)
    return sub if os.path.isdir(sub) else folder


def latest_checkpoint(folder: str) -> Optional[str]:
    """The newest complete checkpoint under `folder` (an output folder, its
    ``checkpoints`` folder), or None when there is none."""
    found = resume_candidates(folder)
    return found[0].path if found else None


def resume_candidates(folder: str, damaged: Optional[List[str]] = None) -> List[Candidate]:
    """Complete checkpoints under `folder`, best first: the one ``latest`` names, then the
    rest newest first. Why each damaged one was passed over is appended to `damaged`."""
    folder = _checkpoints_folder(folder)
    try:
        with open(os.path.join(folder, LATEST), encoding="utf-8") as src:
            pointed = src.read().strip()
    except OSError:
        pointed = ""
    found = []
    for path in sorted(named_checkpoints(folder), key=lambda p: (os.path.basename(p) == pointed,
                                                     checkpoint_order(os.path.basename(p))),
                       reverse=True):
        if missing_files(path):
            continue  # an interrupted save or prune: not a checkpoint
        try:
            found.append(Candidate(path, read_meta(path)))
        except CheckpointError as err:
            if damaged is not None:
                damaged.append(str(err))
    return found


def _usable(folder: str, what: str) -> List[Candidate]:
    """Candidates in `folder`; damaged ones are warned about, or refused if all are."""
    damaged: List[str] = []
    found = resume_candidates(folder, damaged)
    if damaged and not found:
        raise CheckpointError(f"{what}: no usable checkpoint: {damaged[0]}")
    for reason in damaged:
        logger.warning("%s; passing over it", reason)
    return found


def resolve_resume(resume: Optional[str], output_dir: Optional[str]) -> List[Candidate]:
    """The checkpoints `--resume` names, best first: for ``auto``, the complete ones in
    `output_dir` (empty if there is none: start fresh); a path is one checkpoint folder,
    or a folder holding checkpoints. Damaged ones are passed over with a warning; a folder
    whose checkpoints are all damaged is refused."""
    if not resume:
        return []
    if resume == "auto":
        return _usable(output_dir, "--resume auto") if output_dir else []
    if not os.path.exists(resume):
        raise CheckpointError(f"--resume {resume} does not exist")
    if os.path.exists(os.path.join(resume, META)) or os.path.exists(os.path.join(resume, PARAMS)):
        meta = read_meta(resume)
        if missing_files(resume):
            raise CheckpointError(f"checkpoint {resume} is incomplete: files are missing")
        return [Candidate(resume, meta)]
    found = _usable(resume, f"--resume {resume}")
    if not found:
        raise CheckpointError(f"--resume {resume} holds no complete checkpoint")
    return found


def restore(path: str, net, trainer, devices, meta: Optional[Dict] = None) -> Dict:
    """Load checkpoint `path` into `net` and `trainer`; return its metadata (`meta`, when
    it was read already).

    Shapes are compared first, so a checkpoint of another model or dataset is refused with
    the first mismatching parameter named.
    """
    meta = read_meta(path) if meta is None else meta
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
    # What this restore reads: the parameters, and with a trainer everything else.
    changed = changed_files(path, meta, None if trainer is not None else {PARAMS})
    if changed:
        raise CheckpointError(f"checkpoint {path} is corrupt: {', '.join(changed)} changed "
                              f"since it was saved (its SHA-256 differs from the one "
                              f"{META} records)")
    try:
        net.load_parameters(os.path.join(path, PARAMS), ctx=devices)
        if meta.get("has_states") and trainer is not None:
            trainer.load_states(os.path.join(path, STATES))
    except Exception as err:  # MXNet reports corrupt files as many exception types
        raise _corrupt(path, err) from None
    if trainer is not None:
        compression_state.load(path, trainer, meta)
    return meta


def _corrupt(path: str, err: Exception) -> CheckpointError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
    return CheckpointError(f"checkpoint {path} is corrupt: {first}")
