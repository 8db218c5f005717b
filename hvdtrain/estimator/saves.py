"""What an Estimator writes besides the run's checkpoints, and the model states around
those writes: the final files, a CheckpointHandler's save, the running statistics averaged
over the ranks for an evaluation or save inside an epoch, and the shapes Gluon defers."""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Callable, Dict

import mxnet as mx

from ..config import ConfigError
from ..loop.engine.replicas import averaged_running_stats
from ..loop.recipe.ema import FINAL_EMA_PARAMS
from ..loop.run.boundary import host_copy
from ..loop.run.together import write_together
from ..state.checkpoint import gathered_states, save_params
from ..state.writes import atomic_write
from ..store.gluon_internals import params_by_place, shape_deferred

logger = logging.getLogger("hvdtrain")


def save_final(cfg, net, dist, ema, final_files: Dict[str, Callable[[str], None]],
               watchdog) -> None:
    """After the last epoch: rank 0 saves `final_files` (a program's own), ``ema``'s
    average and then the trained parameters (``model.params`` last: a folder holding it
    holds a finished run), busy meanwhile; every rank learns whether it could."""
    if not cfg.output_dir:
        return

    def save():
        if not dist.is_root:
            return
        with watchdog.busy("saving the final parameters"):
            for name, write in final_files.items():
                atomic_write(os.path.join(cfg.output_dir, name), write)
            if ema is not None:
                logger.info("the moving average of the parameters (--ema) saved to %s",
                            atomic_write(os.path.join(cfg.output_dir, FINAL_EMA_PARAMS),
                                         ema.save))
            logger.info("parameters saved to %s",
                        save_params(net, os.path.join(cfg.output_dir, "model.params")))

    write_together(dist, save, "the end")


@contextlib.contextmanager
def averaged_statistics(net, dist, inside_epoch: bool):
    """Inside an epoch (a ``batch_period`` evaluation, a handler's save) each rank's
    running statistics are its own: meanwhile every rank holds their average over the
    ranks, then its own again. At an epoch's end they are averaged already."""
    if not inside_epoch:
        yield
        return
    averages, _ = averaged_running_stats(net, dist)
    own = [(param, [c.copy() for c in param.list_data()]) for param, _ in averages]
    for param, value in averages:
        for copy_ in param.list_data():
            value.copyto(copy_)
    try:
        yield
    finally:
        for param, copies in own:
            for copy_, value in zip(param.list_data(), copies):
                value.copyto(copy_)
        mx.nd.waitall()


def save_model_files(net, trainer, dist, inside_epoch: bool, param_file: str,
                     trainer_file: str) -> None:
    """A CheckpointHandler's save: rank 0 writes the parameters (inside an epoch, the
    running statistics averaged over the ranks) and the trainer's states, each whole or
    not at all; every rank learns whether it could."""
    replace = {}
    if inside_epoch:
        averages, _ = averaged_running_stats(net, dist)
        names = {id(param): name for name, param in params_by_place(net).items()}
        replace = {names[id(param)]: value for param, value in averages}

    states = gathered_states(trainer)  # a sharded optimizer state: every rank sends, 0 holds

    def write():
        if dist.is_root:
            held = host_copy(net, trainer, True, replace, states)
            atomic_write(param_file, held.save_parameters)
            atomic_write(trainer_file, held.save_states)

    write_together(dist, write, f"a CheckpointHandler save ({param_file})")


def settle_shapes(estimator, train_feed) -> None:
    """Gluon defers a parameter's shape to the first forward pass; the start-up broadcast
    needs them all. One training batch's forward pass (in training mode: an inference pass
    lets MKL-DNN reorder weights in place, which the broadcast cannot read; no gradient
    recorded) settles them: the training net's (the validation net may be another block),
    run as ``evaluate_batch`` with it in the validation net's place. MXNet 1.x moves
    BatchNorm's statistics in the backward pass only: none runs here."""
    net = estimator.net
    if not any(shape_deferred(p) for p in net.collect_params().values()):
        return
    train_feed.sampler.set_epoch(estimator.state.epoch)
    batch = next((b for b in train_feed
                  if estimator.processor.batch_samples(b, estimator.batch_axis)), None)
    if batch is None:
        raise ConfigError("no training batch holds a usable sample: nothing to train on")
    val_net, val_loss = estimator.val_net, estimator.val_loss
    estimator.val_net, estimator.val_loss = net, estimator.loss
    try:
        with mx.autograd.train_mode():
            estimator.processor.evaluate_batch(estimator, batch, estimator.batch_axis,
                                               check=False)
    finally:
        estimator.val_net, estimator.val_loss = val_net, val_loss
    mx.nd.waitall()
