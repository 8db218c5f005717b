"""The training recipe's parts a run of any model carries through
:func:`~hvdtrain.loop.run.fit.fit`: gradient clipping and the moving average, with what each
adds to an epoch's metrics record, its log line and its checkpoint. (``--no-wd`` and
``--last-gamma`` act once, when the trainer and the model are built:
:mod:`hvdtrain.loop.engine.weight_decay`, :mod:`.last_gamma`; mixing is image classification's, in its batch
processor: :mod:`hvdtrain.classify.processor`.)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from .clipping import GradClipper
from .ema import EMA_PARAMS, WeightAverage
from .mixing import MEASURES
from ..engine.schedule import warmup_steps

logger = logging.getLogger("hvdtrain")


@dataclass
class Recipe:
    """``--clip-grad-norm`` and ``--ema`` of one run (each None when off)."""

    clipper: Optional[GradClipper] = None
    ema: Optional[WeightAverage] = None

    @classmethod
    def of(cls, cfg, net, dist, steps_per_epoch: int,
           ema: Optional[WeightAverage] = None) -> "Recipe":
        """The parts `cfg` turns on; `ema`, the job's average (it outlives one ``fit``: an
        elastic job enters ``fit`` again after a reset), or a fresh one from the model as
        it is now. The average copies the model through the warm-up's steps."""
        ema = ema if ema is not None else WeightAverage.of(cfg, net)
        if ema is not None:
            ema.warmup_steps = warmup_steps(cfg.warmup_epochs, steps_per_epoch)
            total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * steps_per_epoch
            if total < ema.every:  # e.g. a short trial run at the default of 32
                logger.warning("--ema: this run ends at optimizer step %d and the average "
                               "updates every %d (--ema-every): it never moves from the "
                               "starting model; give --ema-every %d or less",
                               total, ema.every, max(total, 1))
        return cls(GradClipper.of(cfg, net, dist), ema)

    def statistics(self) -> List:
        """Arrays to average over the ranks with the model's running statistics."""
        return self.ema.statistics() if self.ema is not None else []

    def train_figures(self) -> dict:
        """What an epoch's record adds about its training: the clipping figures since the
        last call."""
        return self.clipper.take() if self.clipper is not None else {}

    def ema_figures(self, evaluate: Callable[[], Dict[str, Optional[float]]]) -> dict:
        """`evaluate()` again with the average in the model: its figures (the record's
        names, "ema_" in front; none without ``--ema``)."""
        if self.ema is None:
            return {}
        with self.ema.applied():
            figures = evaluate()
        return {f"ema_{name}": value for name, value in figures.items()}

    def attach(self, checkpointer) -> None:
        """Make each checkpoint hold the average (``ema.params``, named in its meta)."""
        if self.ema is None or checkpointer is None:
            return
        checkpointer.files[EMA_PARAMS] = lambda: self.ema.files()[EMA_PARAMS]
        checkpointer.meta["ema"] = {"decay": self.ema.decay, "every": self.ema.every,
                                    "file": EMA_PARAMS}


def log_suffix(record: dict) -> str:
    """The epoch log line's words for the recipe's figures in `record` (may be empty)."""
    words = []
    if record.get("train_acc_measures") == MEASURES[True]:
        words.append("(train acc: agreement with each mixed sample's dominant label)")
    if "ema_test_acc" in record:
        words.append(f"ema test acc {record['ema_test_acc']:.4f}")
    if record.get("grad_norm_mean") is not None:
        words.append(f"grad norm mean {record['grad_norm_mean']:.3g} max "
                     f"{record['grad_norm_max']:.3g} ({record['clipped_steps']} steps clipped)")
    return ("  " + "  ".join(words)) if words else ""
