"""Which checkpoint ``--resume`` means, and loading one.

``--resume auto`` (or a folder) names the complete checkpoints best first: the one ``latest``
points at, then the others newest first. Interrupted saves (files missing) are not
checkpoints; damaged ones (an invalid ``meta.json``, a parameter file that does not load) are
passed over with a warning while an older one remains, and refused in one line otherwise.
"""
from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional

import mxnet as mx

from .checkpoint import (CHECKPOINTS, LATEST, META, PARAMS, STATES, CheckpointError,
                         checkpoint_order, missing_files, named_checkpoints, param_shapes,
                         read_meta)

logger = logging.getLogger("hvdtrain")


def _checkpoints_folder(folder: str) -> str:
    sub = os.path.join(folder, CHECKPOINTS)
    return sub if os.path.isdir(sub) else folder


def latest_checkpoint(folder: str) -> Optional[str]:
    """The newest complete checkpoint under `folder` (an output folder, its
    ``checkpoints`` folder), or None when there is none."""
    found = resume_candidates(folder)
    return found[0] if found else None


def resume_candidates(folder: str, damaged: Optional[List[str]] = None) -> List[str]:
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
            read_meta(path)
            found.append(path)
        except CheckpointError as err:
            if damaged is not None:
                damaged.append(str(err))
    return found


def _usable(folder: str, what: str) -> List[str]:
    """Candidates in `folder`; damaged ones are warned about, or refused if all are."""
    damaged: List[str] = []
    found = resume_candidates(folder, damaged)
    if damaged and not found:
        raise CheckpointError(f"{what}: no usable checkpoint: {damaged[0]}")
    for reason in damaged:
        logger.warning("%s; passing over it", reason)
    return found


def resolve_resume(resume: Optional[str], output_dir: Optional[str]) -> List[str]:
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
        read_meta(resume)
        if missing_files(resume):
            raise CheckpointError(f"checkpoint {resume} is incomplete: files are missing")
        return [resume]
    found = _usable(resume, f"--resume {resume}")
    if not found:
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
        raise _corrupt(path, err) from None
    return meta


def _corrupt(path: str, err: Exception) -> CheckpointError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
    return CheckpointError(f"checkpoint {path} is corrupt: {first}")


def loadable(candidates: List[str]) -> List[str]:
    """`candidates` whose parameter file reads, so that a damaged one is refused (or passed
    over, when an older one remains) before the run writes anything. A damaged optimizer
    state file shows only when it is loaded, and falls back the same way then."""
    found = []
    for index, path in enumerate(candidates):
        try:
            mx.nd.load(os.path.join(path, PARAMS))
            found.append(path)
        except Exception as err:  # pylint: disable=broad-except
            if index == len(candidates) - 1 and not found:
                raise _corrupt(path, err) from None
            logger.warning("%s; falling back to an older checkpoint", _corrupt(path, err))
    return found
