"""Which parameters and which model card an export starts from.

``RUN_OR_CHECKPOINT`` is either a finished run's output folder (``model.params`` and
``model.json``, written in that order at its end) or one checkpoint folder
(``checkpoints/epoch-NNNN[-step-SSSSSSS]``: ``model.params`` and ``meta.json``, whose
``card`` is the same model card). Whatever else it is, is refused in one line that says what
to give instead. With ``ema``, the parameters are the run's ``--ema`` average
(``model-ema.params`` beside a run's ``model.params``, ``ema.params`` in a checkpoint).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict

from ..config import ConfigError
from ..data.card import CARD_FILE, check_card, read_card
from ..loop.recipe.ema import EMA_PARAMS, FINAL_EMA_PARAMS
from ..state.checkpoint_files import (CHECKPOINTS, META, PARAMS, complete_checkpoints,
                                      read_meta)


class SourceError(ConfigError):
    """A run or checkpoint that cannot be exported; the message says why and what to do."""


@dataclass(frozen=True)
class Source:
    """The parameter file to export, the card describing its model, and what it is."""

    params: str
    card: Dict
    describe: str


def find_source(path: str, ema: bool = False) -> Source:
    """The run or checkpoint at `path` (raises :class:`SourceError` or a CardError); with
    `ema`, its ``--ema`` average instead of its parameters."""
    source = _find_source(path)
    if not ema:
        return source
    folder = os.path.dirname(source.params)
    average = os.path.join(folder, EMA_PARAMS if source.describe.startswith("checkpoint")
                           else FINAL_EMA_PARAMS)
    if not os.path.isfile(average):
        raise SourceError(f"{source.describe} holds no {os.path.basename(average)}: it was "
                          f"trained without --ema; export it without --ema")
    return Source(average, source.card, f"{source.describe} (its --ema average)")


def _find_source(path: str) -> Source:
    if not os.path.isdir(path):
        problem = "does not exist" if not os.path.lexists(path) else "is not a folder"
        raise SourceError(f"{path} {problem}: give a run's output folder (--output-dir) or "
                          f"one of its checkpoints/epoch-* folders")
    if os.path.isfile(os.path.join(path, META)):
        return _checkpoint(path)
    params, card = os.path.join(path, PARAMS), os.path.join(path, CARD_FILE)
    if os.path.isfile(params):
        if not os.path.isfile(card):
            raise SourceError(f"{path} has {PARAMS} but no {CARD_FILE} (the model card: "
                              f"classes, input size, transform): it was trained by an "
                              f"hvdtrain that did not write one; export one of its "
                              f"{CHECKPOINTS}/epoch-* folders if they carry a card, or "
                              f"train it again")
        return Source(params, read_card(card), f"run {path}")
    checkpoints = complete_checkpoints(os.path.join(path, CHECKPOINTS))
    if checkpoints:
        raise SourceError(f"{path} holds no {PARAMS}: the run never finished (stopped, "
                          f"failed or still running); export its newest checkpoint "
                          f"instead: {checkpoints[-1]}")
    raise SourceError(f"{path} is neither a finished run (no {PARAMS}) nor a checkpoint (no "
                      f"{META}), and holds no checkpoint: give a run's --output-dir or one "
                      f"of its checkpoints/epoch-* folders")


def _checkpoint(path: str) -> Source:
    meta = read_meta(path)  # CheckpointError (one line) when damaged
    params = os.path.join(path, PARAMS)
    if not os.path.isfile(params):
        raise SourceError(f"checkpoint {path} has no {PARAMS}: it is incomplete (a save cut "
                          f"short?); export another checkpoint")
    if "card" not in meta:
        raise SourceError(f"checkpoint {path} has no model card in its {META} (written by "
                          f"an hvdtrain before cards): it cannot say its classes, input size "
                          f"and transform; export a checkpoint of a newer run")
    return Source(params, check_card(meta["card"], f"{os.path.join(path, META)}'s card"),
                  f"checkpoint {path}")
