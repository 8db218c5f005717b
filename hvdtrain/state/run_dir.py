"""The output folder and the resume of one run, in three phases.

1. :meth:`RunDir.decide`, on each rank with no collective, before any data is loaded: refuse a
   folder another run holds, a fresh run into a folder with checkpoints, and a checkpoint
   this run cannot continue; name the candidates to resume from, best first, each with its
   ``meta.json`` read once. No parameter file is loaded yet.
2. :meth:`RunDir.restore`, once the model and trainer exist: load the first candidate that
   loads (passing over damaged ones with a warning) and apply the settings that may change.
   It writes nothing, so a checkpoint that does not load is refused with the folder as it was.
3. :meth:`RunDir.claim`: rank 0 checks the folder is writable, locks it and clears what
   interrupted saves left; then the one collective of the three phases tells every rank
   whether the folder was free and whether all continue from the same position. Leaving the
   ``with run_dir.claim(dist):`` block drops the lock.

Every rule that refuses a run because of its output folder or its checkpoints is applied
here (or in :mod:`.resume`, :mod:`.resume_from` on its behalf), each once.
"""
from __future__ import annotations

import logging
import os
import time
from typing import List, Optional

import mxnet as mx

from .checkpoint import clear_leftovers
from .checkpoint_files import CHECKPOINTS, CheckpointError, missing_files, named_checkpoints
from ..config import ConfigError, TrainConfig
from .lock import OutputLock, elastic_job, launch_of
from .resume import check_compatible, resumed_state
from .resume_from import Candidate, resolve_resume, restore
from .train_state import TrainState
from .writes import check_writable_dir

logger = logging.getLogger("hvdtrain")


class RunDir:
    """One run's output folder (``cfg.output_dir``, may be None) and what it resumes from.

    Make it with :meth:`decide`; then :meth:`restore` and :meth:`claim`, in that order.

    Attributes
    ----------
    candidates : list of Candidate
        The checkpoints ``--resume`` names, best first (empty for a fresh run).
    """

    def __init__(self, cfg: TrainConfig, candidates: List[Candidate]):
        self.cfg = cfg
        self.output_dir = cfg.output_dir
        self.candidates = candidates
        self._lock: Optional[OutputLock] = None
        # What restore found, compared across ranks at claim: (epoch + 1, step, samples).
        self._found: Optional[str] = None
        self._position = [0, 0, 0]

    @property
    def resumed_from(self) -> Optional[str]:
        """The checkpoint :meth:`restore` loaded (None for a fresh start)."""
        return self._found

    @classmethod
    def decide(cls, cfg: TrainConfig) -> "RunDir":
        """Everything that can be refused from the folder alone, on each rank, no collective.

        A folder in use is refused first, before its checkpoints are even read: they may be
        half-pruned under that run, and any advice about them would be refused as well.
        """
        if cfg.output_dir:
            holder = OutputLock(cfg.output_dir, elastic_job(), launch_of()).held_by_another()
            if holder:
                raise ConfigError(f"--output-dir {cfg.output_dir} is in use by another run "
                                  f"({holder}): wait for it to end, or give another "
                                  f"--output-dir")
        if not cfg.resume:
            _refuse_fresh_run(cfg.output_dir)
            return cls(cfg, [])
        candidates = resolve_resume(cfg.resume, cfg.output_dir)
        if candidates:  # the others are checked when a fall-back reaches them
            check_compatible(candidates[0].path, candidates[0].meta, cfg)
        return cls(cfg, candidates)

    def check_classes(self, classes: Optional[List[str]]) -> None:
        """Refuse, in one line, to resume a checkpoint trained on other class names (an
        image folder's or pack's, saved in its meta): output ``i`` would go on meaning the
        checkpoint's class ``i``, whatever the data now calls it. A class list of the same
        length would otherwise load and train without a word."""
        if not classes or not self.candidates:
            return
        path, saved = self.candidates[0].path, self.candidates[0].meta.get("classes")
        if saved is None or list(saved) == list(classes):
            return
        gone, new = sorted(set(saved) - set(classes)), sorted(set(classes) - set(saved))

        def few(names):
            return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "") or "none"

        what = (f"only in the checkpoint: {few(gone)}; only in --data-dir: {few(new)}"
                if gone or new else "the same names in another order")
        raise CheckpointError(f"cannot resume {path}: it was trained on {len(saved)} classes "
                              f"and --data-dir {self.cfg.data_dir} has {len(classes)} ({what}): "
                              f"resume with the data it was trained on, or start a new run "
                              f"in another --output-dir")

    def restore(self, net, trainer, devices, dist, worker_batch: int,
                train_length: int) -> TrainState:
        """Load the first candidate that loads into `net` and `trainer` and return the
        :class:`TrainState` training continues from (a fresh one without ``--resume``).

        Every rank loads the same files (the checkpoint must be visible to all of them). A
        damaged checkpoint is passed over with a warning when an older one remains; which
        position each rank found is compared at :meth:`claim`.
        """
        if not self.cfg.resume:
            return TrainState()
        found = self._load_first(net, trainer, devices)
        if found is None:
            logger.info("no checkpoint to resume from: starting fresh")
            return TrainState()
        self._found = found.path
        self._position = [int(found.meta["epoch"]) + 1, int(found.meta["step"]),
                          int(found.meta.get("epoch_samples", 0))]
        return resumed_state(found.path, found.meta, trainer, dist, self.cfg, worker_batch,
                             train_length)

    def claim(self, dist, elastic: bool = False) -> "RunDir":
        """Rank 0 checks the folder is writable, locks it and clears what interrupted saves
        left. One collective then tells every rank whether the folder was free, and checks
        that they all continue from the same position (a rank that loaded another checkpoint
        would meet the others at a different step and hang); all refuse together otherwise.
        Use as ``with run_dir.claim(dist):``.

        `elastic`: called again after every reset of an elastic job, whose ranks may have
        been renumbered: a rank that held the lock and is no longer rank 0 lets it go, the
        new rank 0 takes it, and positions are not compared (the reset's sync made them
        rank 0's)."""
        lock, busy = None, 0
        if self._lock is not None and not dist.is_root:
            self.release()  # the new rank 0 waits for it (_acquire)
        if self.output_dir and dist.is_root and self._lock is None:
            check_writable_dir(self.output_dir, "--output-dir")
            lock = OutputLock(self.output_dir, elastic_job() if elastic else None, launch_of())
            busy = 0 if _acquire(lock) else 1
            if not busy:
                self._lock = lock
                folder = os.path.join(self.output_dir, CHECKPOINTS)
                removed = clear_leftovers(folder)
                if removed:
                    logger.warning("removed what interrupted saves left in %s: %s", folder,
                                   ", ".join(removed))
        try:
            self._agree(dist, busy, lock, compare=not elastic)
        except BaseException:
            self.release()  # a refusal here leaves the lock free for the next run
            raise
        return self

    def _agree(self, dist, busy: int, lock: Optional[OutputLock], compare: bool = True) -> None:
        """Claim's collective (see there); refuse on every rank when it disagrees."""
        agree = dist.num_workers > 1 and (self.output_dir or self.cfg.resume)
        if agree and dist.synchronous:
            mine = [busy] + (_digits(self._position) if compare else [])
            total = [int(v) for v in dist.sum_across_workers(
                "run_dir_agreement", mx.nd.array(mine)).asnumpy()]
            _refuse_busy(self.output_dir, total[0], lock, dist.is_root)
            if total[1:] != [v * dist.num_workers for v in mine[1:]]:
                raise CheckpointError(f"ranks found different checkpoints to resume from "
                                      f"(this rank: {self._found or 'none'}); is the output "
                                      f"folder shared by all ranks?")
        elif agree and self.cfg.resume:  # dist_async: no collective to compare with
            logger.info("dist_async: the workers cannot compare which checkpoint each found "
                        "(an asynchronous store has no collective); each read %s by the "
                        "same rules", self._found or "no checkpoint")
        _refuse_busy(self.output_dir, busy, lock, dist.is_root)

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *_exc) -> None:
        self.release()

    def release(self) -> None:
        """Drop the lock taken by :meth:`claim` (rank 0; nothing elsewhere)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _load_first(self, net, trainer, devices) -> Optional[Candidate]:
        """The first candidate that loads (None for none); refuses when none does."""
        for index, candidate in enumerate(self.candidates):
            if index:  # the first was checked by decide
                check_compatible(candidate.path, candidate.meta, self.cfg, warn=False)
            try:
                restore(candidate.path, net, trainer, devices, candidate.meta)
            except CheckpointError as err:
                if index == len(self.candidates) - 1:
                    if index:
                        raise CheckpointError(f"{err} (and no older checkpoint loads "
                                              f"either)") from None
                    raise
                logger.warning("%s; falling back to an older checkpoint", err)
                continue
            if index:
                logger.warning("resuming from %s, the newest checkpoint that loads",
                               candidate.path)
            return candidate
        return None


def _acquire(lock: OutputLock, wait: float = 30.0) -> bool:
    """Take `lock`; in an elastic job, wait up to `wait` seconds for a process of the same
    job to let it go (a rank 0 renumbered by a reset releases it as it re-claims)."""
    deadline = time.monotonic() + wait
    while not lock.acquire():
        if not lock.job or lock.held_by_another() or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _refuse_fresh_run(output_dir: Optional[str]) -> None:
    """Refuse a run without ``--resume`` into a folder holding another run's checkpoints:
    its saves would be pruned against the old run's, and a later ``--resume auto`` would
    pick the old run's newest."""
    if not output_dir:
        return
    found = [p for p in named_checkpoints(os.path.join(output_dir, CHECKPOINTS))
             if not missing_files(p)]
    if found:
        raise ConfigError(
            f"--output-dir {output_dir} already holds checkpoints of an earlier run (newest: "
            f"{os.path.basename(found[-1])}): continue it with --resume auto, or start over "
            f"in another --output-dir (or after deleting {os.path.join(output_dir, CHECKPOINTS)})")


def _refuse_busy(output_dir: Optional[str], busy: int, lock: Optional[OutputLock],
                 is_root: bool) -> None:
    """Refuse on every rank when rank 0 found `output_dir` held by another run."""
    if not busy:
        return
    if is_root:
        raise ConfigError(f"--output-dir {output_dir} is in use by another run "
                          f"({lock.holder()} holds {lock.path}): wait for it to end, or "
                          f"give another --output-dir")
    raise ConfigError(f"rank 0 found --output-dir {output_dir} in use by another run")


def _digits(values: List[int]) -> List[int]:
    """`values` as 12-bit digits (three each, so up to 2**36), whose sums over up to 4096
    ranks stay below 2**24: exact in the float32 the stores sum, where a step count or a
    sample count summed whole would round beyond 16.7 million."""
    return [value >> shift & 4095 for value in values for shift in (24, 12, 0)]
