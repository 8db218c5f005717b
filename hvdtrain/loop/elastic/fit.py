"""``--elastic``: :func:`~hvdtrain.loop.run.fit.fit` under Horovod's elastic driver.

The job runs ``fit`` inside Horovod's elastic loop (:mod:`hvdtrain.runtime.elastic_run`)
with its state in a :class:`~hvdtrain.loop.elastic.state.GluonState`. A commit every
``--commit-every`` steps and at every epoch's end copies the model, the optimizer and the
position to host memory. When a rank fails, the survivors restore the last commit; when
the driver adds or removes hosts, the workers keep what they hold. Either way Horovod is
reset on the new set of workers, rank 0's state is broadcast to all of them (new ones
included), and ``fit`` starts again from the position that state holds.

Everything that depends on the world size is therefore read again at every entry: the
layout (:class:`DistContext`), the split of the epoch's remaining samples over the workers
(``SplitSampler.set_epoch``), the learning rate (``--lr-scaling``), the global batch of
each step and the outputs' writer (rank 0 may be another process now).

The policy on a resize (docs/elastic.md): each worker keeps ``--batch-size``, so the
global batch follows the world size, and the learning rate follows ``--lr-scaling``
(``none``: the same rate; ``linear``: proportional to the workers). A worker's batch is
what fits its GPU's memory, and keeping it keeps every step's cost the same.
"""
from __future__ import annotations

import logging
import zlib
from typing import Callable, List, Optional, Tuple

from ...config import RunConfig
from ...report.log import info_on_every_rank, setup_logging
from ...runtime import elastic_run
from ...runtime.watchdog import ELASTIC_RESET, Watchdog, gloo_timeout
from ...store.dist import DistContext
from ...store.gluon_internals import params_by_place
from .state import GluonState
from ..run.fit import RunParts, fit
from ...state.train_state import TrainState

logger = logging.getLogger("hvdtrain")


def params_digest(net) -> str:
    """A CRC of every array of `net` (weights and running statistics), for the line each
    rank logs after a reset: equal on all ranks iff their arrays are equal."""
    crc = 0
    for _, param in sorted(params_by_place(net).items()):
        crc = zlib.crc32(param.data().asnumpy().tobytes(), crc)
    return f"{crc:08x}"


def fit_elastic(net, trainer, store, cfg: RunConfig, position: TrainState, run_dir,
                watchdog: Watchdog, make_run: Callable[[DistContext, TrainState, Callable],
                                                       RunParts],
                finish: Callable[[DistContext], None],
                ema=None) -> Tuple[DistContext, dict]:
    """Train as :func:`~hvdtrain.loop.run.fit.fit` does, surviving the loss and the arrival
    of workers.

    Parameters
    ----------
    store
        The Horovod store; the layout is read from it again after every reset.
    position : TrainState
        Where training starts (a resumed checkpoint's position, or the start).
    run_dir : RunDir
        Claimed again at every entry (rank 0 may be another process after a reset).
    make_run : callable
        ``make_run(dist, position, commit)``: the run's parts for this layout (its outputs,
        rank 0's writers; its data split over the workers there are now), with the commit
        hook to call.
    finish : callable
        ``finish(dist)``: what every rank does after the last epoch (the final save).
    ema : WeightAverage, optional
        ``--ema``'s average, committed, restored and synced with the model.

    Returns
    -------
    (DistContext, dict)
        The layout training ended with, and ``fit``'s result.
    """
    state = GluonState(net, trainer, position, ema=ema)
    sizes: List[int] = []  # the world size of each entry, in this process

    def commit(position_now: TrainState, point: str) -> None:
        # Every rank reaches the same step, so every rank commits at the same point: a
        # commit broadcasts the driver's host updates (Horovod's State.commit).
        if point in ("epoch done", "before save"):
            # Saved before the epoch's outputs (or a checkpoint inside the epoch: a step or
            # time interval, a stop), without the host check (a host update now would skip
            # them): ranks that wait for rank 0's checkpoint longer than the Gloo timeout
            # roll back to here, not to before it, which would write it again.
            state.save()
        elif point == "epoch written" or position_now.step % cfg.commit_interval == 0:
            state.commit()

    def train(state: GluonState) -> Tuple[DistContext, dict]:
        dist = DistContext.from_store(store)
        setup_logging(dist.rank)
        watchdog.set_rank(dist.rank)
        watchdog.beat("start-up (elastic sync)")
        run_dir.claim(dist, elastic=True)
        run = make_run(dist, state.position, commit)
        before = _figures(cfg, sizes[-1], run) if sizes else None
        _announce(cfg, dist, state.position, sizes[-1] if sizes else None, before,
                  _figures(cfg, dist.num_workers, run), params_digest(net))
        sizes.append(dist.num_workers)
        run.outputs.metrics.write("elastic", num_workers=dist.num_workers,
                                  previous_num_workers=sizes[-2] if len(sizes) > 1 else None,
                                  **_figures(cfg, dist.num_workers, run),
                                  epoch=state.position.epoch, step=state.position.step,
                                  epoch_samples=state.position.epoch_samples)
        with elastic_run.collective_errors():
            result = fit(run)
            finish(dist)
        return dist, result

    return elastic_run.run(train, around_reset=lambda: watchdog.busy(ELASTIC_RESET))(state)


def _figures(cfg: RunConfig, num_workers: int, run: RunParts) -> dict:
    """The global batch and the base learning rate at `num_workers` (the policy: each
    worker keeps its batch; the rate follows --lr-scaling)."""
    rate = run.base_lr
    if rate is not None and cfg.lr_scaling == "linear":
        rate = rate / run.dist.num_workers * num_workers
    return dict(global_batch=cfg.global_batch(run.train_feed.batch_size, num_workers),
                base_lr=rate)


def _announce(cfg: RunConfig, dist: DistContext, position: TrainState,
              previous: Optional[int], before: Optional[dict], now: dict, digest: str) -> None:
    """Rank 0 says where training (re)starts and what the resize changed; every rank
    names the digest of its arrays (equal everywhere after the sync)."""
    where = (f"epoch {position.epoch + 1}, step {position.step}, {position.epoch_samples} "
             f"samples into the epoch")
    if previous is None:
        logger.info("elastic: %d worker(s) at %s; a commit every %d steps; on a resize each "
                    "worker keeps batch %d and the rate follows --lr-scaling %s; a peer that "
                    "goes silent is given up after HOROVOD_GLOO_TIMEOUT_SECONDS=%g s",
                    dist.num_workers, where, cfg.commit_interval, cfg.batch_size,
                    cfg.lr_scaling, gloo_timeout())
    else:
        logger.info("elastic reset: %d -> %d worker(s), continuing at %s; global batch "
                    "%d -> %d, lr %s -> %s (--lr-scaling %s)", previous, dist.num_workers,
                    where, before["global_batch"], now["global_batch"], _rate(before),
                    _rate(now), cfg.lr_scaling)
    info_on_every_rank(logger, "elastic: rank %d of %d synced at step %d, arrays %s",
                       dist.rank, dist.num_workers, position.step, digest)


def _rate(figures: dict) -> str:
    rate = figures["base_lr"]
    return "the optimizer's own" if rate is None else f"{rate:g}"
