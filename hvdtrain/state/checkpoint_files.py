"""What a checkpoint folder is on disk: its name, its files and its validated metadata.

Layout under the output folder::

    checkpoints/epoch-0003/model.params     parameters (Gluon save_parameters)
                          trainer.states   optimizer state (Trainer.save_states)
                          ema.params       --ema's average, when on (meta's "files")
                          meta.json        written last: epoch, step, config, shapes, each
                                           other file's SHA-256 (checked at resume), ...
                          powersgd.npz     with --compression powersgd: Q, errors' sum
    checkpoints/epoch-0003-step-0000041/    stopped inside epoch 4 at step 41 (--max-steps)
    checkpoints/latest                     name of the newest complete checkpoint

:mod:`.checkpoint` writes them; ``meta.json`` is validated whenever it is read
(:func:`read_meta`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Dict, List

from ..config import ConfigError

CHECKPOINTS = "checkpoints"
LATEST = "latest"
META = "meta.json"
PARAMS = "model.params"
STATES = "trainer.states"
COMPRESSION = "powersgd.npz"
# epoch-0003: after 3 whole epochs; epoch-0003-step-0000041: stopped inside the 4th epoch
# at optimizer step 41.
NAME_PATTERN = re.compile(r"^epoch-(\d{4,})(?:-step-(\d{7,}))?$")


def checkpoint_name(epoch: int, step: int, epoch_samples: int = 0) -> str:
    """Folder name of a checkpoint after `epoch` whole epochs (and, inside the next epoch,
    `epoch_samples` samples and `step` optimizer steps)."""
    return f"epoch-{epoch:04d}" + (f"-step-{step:07d}" if epoch_samples else "")


def checkpoint_order(name: str):
    """Sort key of a checkpoint name: (epochs completed, step inside the next epoch)."""
    found = NAME_PATTERN.match(name)
    return int(found.group(1)), int(found.group(2) or 0)


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used; the message says which and why."""


def param_shapes(net) -> Dict[str, List[int]]:
    """Parameter name (as ``save_parameters`` writes it) to shape."""
    return {name: list(p.shape) for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def named_checkpoints(folder: str) -> List[str]:
    """Every ``epoch-*`` folder in `folder`, oldest first."""
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, n)
            for n in sorted((n for n in os.listdir(folder) if NAME_PATTERN.match(n)),
                            key=checkpoint_order)]


def complete_checkpoints(folder: str) -> List[str]:
    """Complete, valid ``epoch-*`` checkpoints in `folder`, oldest first."""
    return [path for path in named_checkpoints(folder) if is_complete(path)]


DIGESTS = "sha256"  # meta.json's field: each file's SHA-256, recorded by the save


def file_digest(path: str) -> str:
    """The SHA-256 of the file at `path`, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        for chunk in iter(lambda: src.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def changed_files(path: str, meta: Dict, names=None) -> List[str]:
    """The files of checkpoint `path` (those in `names`, or all) whose bytes are no longer
    those its save recorded in `meta` (none for a checkpoint saved before digests were
    recorded). A file that is gone is not one: what a missing file means is the reader's
    to say (:func:`missing_files`; a PowerSGD state removed trains on from zero errors)."""
    recorded = meta.get(DIGESTS) or {}
    return sorted(name for name, digest in recorded.items()
                  if (names is None or name in names) and
                  os.path.isfile(os.path.join(path, name)) and
                  file_digest(os.path.join(path, name)) != digest)


def missing_files(path: str) -> bool:
    """Whether checkpoint folder `path` lacks a file its save always writes."""
    if not (os.path.isfile(os.path.join(path, META)) and
            os.path.isfile(os.path.join(path, PARAMS))):
        return True
    try:
        with open(os.path.join(path, META), encoding="utf-8") as src:
            meta = json.load(src)
        has_states, compressed = meta.get("has_states"), meta.get("has_compression_state")
        files = list(meta.get("files", []))
    except (OSError, ValueError, AttributeError, TypeError):
        return False  # damaged, not half-deleted: kept for the user to look at
    if (has_states is True and not os.path.isfile(os.path.join(path, STATES))) or \
            (compressed is True and not os.path.isfile(os.path.join(path, COMPRESSION))):
        return True
    return not all(isinstance(name, str) and os.path.isfile(os.path.join(path, name))
                   for name in files)


def is_complete(path: str) -> bool:
    """Whether `path` holds a checkpoint whose files were all written and whose
    ``meta.json`` is valid."""
    try:
        read_meta(path)
    except CheckpointError:
        return False
    return not missing_files(path)


def _whole(meta: Dict, key: str, default=None) -> int:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a whole number >= 0")
    return value


def read_meta(path: str) -> Dict:
    """The validated ``meta.json`` of checkpoint `path` (raises CheckpointError)."""
    try:
        with open(os.path.join(path, META), encoding="utf-8") as src:
            meta = json.load(src)
        if not isinstance(meta, dict):
            raise TypeError("not an object")
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} is incomplete or corrupt: cannot read "
                              f"{META} ({err.__class__.__name__})") from None
    try:
        epoch, step = _whole(meta, "epoch"), _whole(meta, "step")
        samples = _whole(meta, "epoch_samples", 0)
        _whole(meta, "epoch_skipped", 0)
        if not isinstance(meta.get("has_states", False), bool):
            raise ValueError(f"has_states is {meta['has_states']!r}, not true or false")
        name = os.path.basename(os.path.normpath(path))
        if NAME_PATTERN.match(name) and name != checkpoint_name(epoch, step, samples):
            raise ValueError(f"epoch {epoch}, step {step} do not match the folder name")
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path} has an invalid {META}: {err}") from None
    return meta
