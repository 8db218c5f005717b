"""``hvdtrain --eval-only``: one rank's part of evaluating existing weights, no training step.

The same launchers, stores and loaders as training: each rank reads the weights itself
(``--init-from``: a run, a checkpoint, an export or a ``.params`` file; or ``--pretrained``),
scores its shard of the validation split (every sample on exactly one rank), and the ranks
sum the report (:func:`~hvdtrain.classify.eval_detail.evaluate_detailed`). Rank 0 logs the
figures and writes the report files into ``--output-dir``
(:mod:`hvdtrain.report.eval_report`). The model is the one the weights' model card names
unless ``--model`` says otherwise (then the two must agree), and the classes must be the
data's: evaluating a freshly initialised output layer would measure nothing.
"""
from __future__ import annotations

import dataclasses
import logging
from contextlib import ExitStack

import mxnet as mx

from .config import ConfigError, TrainConfig
from .data.card import model_card
from .data.datasets import check_dataset
from .data.load import load_dataset
from .classify.build import build_loaders, initialize
from .classify.eval_detail import evaluate_detailed
from .estimator.setup import start_rank
from .job import build_devices, build_dist
from .loop.engine import precision
from .loop.engine.counts import check_bad_samples
from .loop.weights.start import load_start_weights, plan
from .loop.run.together import write_together
from .loop.weights.files import WeightsFile, init_from, pretrained_file, read
from .models import build_model, check_model_name
from .report.eval_report import write_eval_report
from .report.log import launch_rank, setup_logging
from .runtime.lifeline import LauncherWatch, launcher_chain
from .runtime.watchdog import Watchdog
from .state.writes import check_writable_dir

logger = logging.getLogger("hvdtrain")


def read_weights(cfg: TrainConfig) -> WeightsFile:
    """The weights to evaluate; ``--init-from`` without ``--model`` takes the source's."""
    if cfg.pretrained:
        return read(pretrained_file(cfg.model_name), "--pretrained")
    return init_from(cfg.init_from, cfg.model)


def _as_trained(cfg: TrainConfig, weights: WeightsFile) -> TrainConfig:
    """`cfg` with the model and image size the weights' card names where the command names
    none; a size that differs from the card's is refused (scores at another size than the
    model learnt are not its accuracy)."""
    if cfg.model is None and weights.model:
        cfg = dataclasses.replace(cfg, model=weights.model)
    shape = (weights.card or {}).get("input", {}).get("shape")
    if shape and cfg.dataset in ("imagefolder", "recordio"):
        if cfg.image_size is None:
            cfg = dataclasses.replace(cfg, image_size=shape[1])
        elif cfg.image_size != shape[1]:
            raise ConfigError(f"--eval-only: {weights.named} was trained on {shape[1]}x"
                              f"{shape[2]} images (its model card), not --image-size "
                              f"{cfg.image_size}: drop --image-size to evaluate at the "
                              f"trained size")
    return cfg


def evaluate_only(cfg: TrainConfig, devices=None, comm=None) -> dict:
    """Evaluate the weights `cfg` names on its validation split in this process (one rank
    of the job); return the figures every rank holds. Refuses in one line, before any
    collective, weights that do not fit the model or the data's classes."""
    setup_logging(launch_rank())
    watchdog = Watchdog(cfg.stall_timeout)
    with ExitStack() as until_the_end:
        until_the_end.enter_context(LauncherWatch(launcher_chain(), describe=watchdog.who))
        check_dataset(cfg.dataset, cfg.data_dir)
        weights = read_weights(cfg)
        cfg = _as_trained(cfg, weights)
        check_model_name(cfg.model_name)
        if cfg.output_dir:
            check_writable_dir(cfg.output_dir, "--output-dir")
        data = load_dataset(cfg.dataset, cfg.data_dir, cfg.image_size)
        card = model_card(cfg.model_name, data, cfg.dtype)
        policy = precision.Precision.of(cfg)
        policy.before_model()
        net = build_model(cfg.model_name, data.num_classes)
        until_the_end.enter_context(watchdog)
        dist = build_dist(cfg, comm)
        start_rank(cfg, dist, watchdog)
        devices = build_devices(cfg, dist, policy, devices)
        initialize(net, devices, data.image_shape, cfg.seed, dist.rank, cfg.hybridize)
        fitting = plan(weights, net, data.num_classes, card["classes"], cfg.model_name)
        if fitting.new:  # the same on every rank: each read the same file
            raise ConfigError(f"--eval-only: {fitting.why_new}; the output layer would be "
                              f"new, and its scores chance: evaluate on data of the classes "
                              f"the weights were trained on")
        load_start_weights(net, weights, data.num_classes, card["classes"], cfg.model_name)
        policy.prepare_model(net)
        watchdog.beat("start-up (weights loaded)")
        _, test_loader = build_loaders(data, cfg, dist, len(devices))
        test_loader.sampler.set_epoch(0)
        report = evaluate_detailed(
            net, test_loader, devices, dist, data.num_classes, policy.input_dtype,
            on_batch=lambda b: watchdog.beat(f"evaluation batch {b}"))
        skipped = _skipped(test_loader, dist)
        if skipped or not report.count:
            check_bad_samples("validation", skipped, data.num_test, cfg.max_bad_samples,
                              getattr(test_loader, "skipped", []), 0, used=report.count)
        describe = data.test.describe if data.streamed else (lambda i: f"test sample {i}")
        _log(report, weights, skipped, card["classes"], describe)
        if cfg.output_dir:
            summary = dict(weights=weights.path, model=cfg.model_name, dataset=cfg.dataset,
                           data_dir=cfg.data_dir, input_shape=card["input"]["shape"],
                           num_workers=dist.num_workers,
                           skipped_samples=skipped)
            write_together(dist, lambda: _write(cfg.output_dir, report, card["classes"],
                                                describe, summary, dist.is_root),
                           "the evaluation report")
        return {"test_acc": report.accuracy, "test_top5": report.top5,
                "test_count": report.count, "skipped": skipped}


def _skipped(loader, dist) -> int:
    """Validation samples left out as unusable, over all ranks."""
    if not hasattr(loader, "skipped"):
        return 0
    mine = mx.nd.array([len(loader.skipped)])
    if dist.synchronous:
        mine = dist.sum_across_workers("eval_skipped", mine)
    return int(mine.asnumpy()[0])


def _log(report, weights: WeightsFile, skipped: int, classes, describe) -> None:
    logger.info("evaluated %s on %d validation samples%s: top-1 %.4f, top-5 %.4f, loss %.4f",
                weights.path, report.count,
                f" ({skipped} unusable, left out)" if skipped else "", report.accuracy,
                report.top5, report.loss)
    for worst in report.worst[:3]:
        logger.info("  worst: %s, a %s taken for a %s (p(%s) = %.3g)",
                    describe(worst.position), classes[worst.label], classes[worst.predicted],
                    classes[worst.label], worst.probability)


def _write(folder, report, classes, describe, summary, is_root: bool) -> None:
    if is_root:
        paths = write_eval_report(folder, report, classes, describe, summary)
        logger.info("evaluation report: %s", ", ".join(paths))
