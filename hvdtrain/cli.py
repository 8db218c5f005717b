"""The ``hvdtrain`` command: parse, validate, build, fit.

Launch it with one process per GPU::

    horovodrun -np 8 -H d1:4,d2:4 hvdtrain --batch-size 64 --epochs 5 --lr 0.01
    mpirun -np 2 hvdtrain --dataset digits --no-cuda
    hvdtrain --dataset digits --no-cuda          # no launcher: a single worker
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from . import config as cfgmod
from .config import ConfigError, TrainConfig
from .log import error_line
from .guard import NonFiniteLoss
from .job import Run, train  # noqa: F401  (re-exported: ``from hvdtrain.cli import train``)
from .writes import OutputError

logger = logging.getLogger("hvdtrain")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DIVERGED = 0, 1, 2, 3

EXAMPLES = """examples:
  hvdtrain --dataset digits --no-cuda --epochs 5
  horovodrun -np 2 -H localhost:2 hvdtrain --dataset digits --no-cuda --output-dir runs/digits
  horovodrun -np 8 -H d1:4,d2:4 hvdtrain --data-dir ~/data/cifar-10-batches-bin \\
      --model resnet18_v1 --batch-size 64 --epochs 5 --lr 0.01
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _OnOffFlag(argparse.Action):
    """``--NAME`` sets True, ``--no-NAME`` sets False, neither leaves the default.

    ``argparse.BooleanOptionalAction`` does this from Python 3.9 on; the GPU image's Ubuntu
    20.04 has Python 3.8, the floor setup.cfg declares.
    """

    def __init__(self, option_strings, dest, **kwargs):
        names = [name for option in option_strings for name in (option, "--no-" + option[2:])]
        super().__init__(names, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no-"))

    def format_usage(self):
        return " | ".join(self.option_strings)


def _int_list(text: str):
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; defaults come from :class:`TrainConfig`."""
    d = TrainConfig(dataset="digits")
    p = _Parser(prog="hvdtrain", description=(
        "Data-parallel training of MXNet Gluon models with Horovod ring-allreduce. "
        "Run one process per device under horovodrun or mpirun; without a launcher it "
        "trains as a single worker."),
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--dataset", default="cifar10", choices=cfgmod.DATASETS,
                      help="cifar10 (binary files in --data-dir), digits (bundled with "
                           "scikit-learn) or synthetic (random, for throughput) "
                           "(default: cifar10)")
    data.add_argument("--data-dir", help="folder with the CIFAR-10 binary files")
    data.add_argument("--data-workers", type=int, default=d.data_workers,
                      help="threads preparing batches per process (default: %(default)s)")
    data.add_argument("--sampling", default=d.sampling, choices=cfgmod.SAMPLING_MODES,
                      help="how shuffled data is split over workers; strided makes N workers "
                           "x batch b see what 1 worker x batch N*b sees (default: "
                           "%(default)s)")
    model = p.add_argument_group("model")
    model.add_argument("--model", help="Gluon model-zoo name, simple_cnn or mlp "
                                       "(default: simple_cnn for digits, else resnet18_v1)")
    model.add_argument("--no-hybridize", dest="hybridize", action="store_false",
                       help="run the model imperatively (for debugging)")
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--batch-size", type=int, default=d.batch_size,
                     help="samples per device per step (with Horovod: per worker); global "
                          "batch = this x devices per worker x workers (default: "
                          "%(default)s)")
    opt.add_argument("--epochs", type=int, default=d.epochs,
                     help="passes over the training set (default: %(default)s)")
    opt.add_argument("--lr", type=float, default=d.lr,
                     help="learning rate for the GLOBAL batch: gradients are averaged over "
                          "all workers' samples (default: %(default)s)")
    opt.add_argument("--lr-scaling", default=d.lr_scaling, choices=cfgmod.LR_SCALING,
                     help="linear: multiply --lr by the number of workers (default: "
                          "%(default)s)")
    opt.add_argument("--warmup-epochs", type=float, default=d.warmup_epochs,
                     help="linear learning-rate warm-up, in epochs (default: %(default)s)")
    opt.add_argument("--lr-decay-epochs", type=_int_list, default=d.lr_decay_epochs,
                     help="comma-separated epochs at which lr is multiplied by "
                          "--lr-decay-factor (default: none)")
    opt.add_argument("--lr-decay-factor", type=float, default=d.lr_decay_factor,
                     help="factor the learning rate is multiplied by at each "
                          "--lr-decay-epochs epoch (default: %(default)s)")
    opt.add_argument("--optimizer", default=d.optimizer, choices=cfgmod.OPTIMIZERS,
                     help="Gluon optimizer applying the averaged gradients (default: "
                          "%(default)s)")
    opt.add_argument("--momentum", type=float, default=d.momentum,
                     help="for sgd and nag (default: %(default)s)")
    opt.add_argument("--wd", type=float, default=d.wd, help="weight decay (default: %(default)s)")
    opt.add_argument("--seed", type=int, default=d.seed,
                     help="seeds shuffling, augmentation and initialisation (default: "
                          "%(default)s)")
    opt.add_argument("--max-steps", type=int,
                     help="stop after this many optimizer steps in total")
    dist = p.add_argument_group("distribution")
    dist.add_argument("--kvstore", default=d.kvstore, choices=cfgmod.KVSTORES,
                      help="horovod (allreduce), MXNet's local/device/dist_* stores, or none "
                           "(default: %(default)s)")
    dist.add_argument("--fp16-allreduce", action="store_true",
                      help="send gradients as float16 (horovod store)")
    dist.add_argument("--grad-bucket-mb", type=float, default=d.grad_bucket_mb,
                      help="gradients live in flat buckets of at most this many MiB, each "
                           "reduced by one in-place allreduce as soon as backward fills it; "
                           "0: one allreduce per parameter (horovod store) (default: "
                           "%(default)s)")
    model.add_argument("--dtype", default="float32", choices=cfgmod.DTYPES,
                       help="float16 trains a float16 model with float32 master weights "
                            "(GPU only) (default: %(default)s)")
    model.add_argument("--amp", action="store_true",
                       help="MXNet automatic mixed precision with loss scaling (GPU only)")
    dist.add_argument("--no-cuda", action="store_true",
                      help="train on the CPU even if GPUs are visible")
    dist.add_argument("--gpus", type=_int_list, default=d.gpus,
                      help="comma-separated GPU ids this worker drives (parameter server: "
                           "one worker per host, several GPUs)")
    dist.add_argument("--gpus-per-worker", type=int,
                      help="each worker drives this many GPUs, picked by its local rank")
    out = p.add_argument_group("output")
    out.add_argument("--output-dir", help="where rank 0 writes metrics.jsonl, checkpoints/ and "
                                          "model.params")
    out.add_argument("--progress", action=_OnOffFlag, default=None,
                     help="a live progress bar on rank 0 (default: when stderr is a "
                          "terminal; plain log lines otherwise)")
    out.add_argument("--tensorboard", metavar="DIR",
                     help="write TensorBoard scalars (rank 0) to DIR")
    out.add_argument("--horovod-timeline", metavar="FILE",
                     help="write Horovod's timeline of every collective (rank 0) to FILE, "
                          "a Chrome trace: open it in chrome://tracing or Perfetto")
    out.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                     help="save a checkpoint every N epochs, and after the last "
                          "(default: %(default)s)")
    out.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                     help="keep the newest K checkpoints (default: %(default)s)")
    out.add_argument("--resume", help="'auto' (newest checkpoint in --output-dir, or start "
                                      "fresh) or a checkpoint path")
    out.add_argument("--finite-check-every", type=int, default=d.finite_check_every,
                     help="check every N steps that no rank's loss is NaN or infinite "
                          "(default: %(default)s)")
    out.add_argument("--stall-timeout", type=float, default=d.stall_timeout, metavar="SECONDS",
                     help="a rank that completes no training or evaluation step for this long "
                          "logs its last step and exits, ending the job (a frozen rank would "
                          "otherwise hang it); also sets Horovod's stall check unless "
                          "HOROVOD_STALL_* are set; 0: off (default: %(default)s)")
    out.add_argument("--log-interval", type=int, default=d.log_interval,
                     help="log every N steps within an epoch, 0 for epoch lines only "
                          "(default: %(default)s)")
    return p


def parse_config(argv: Optional[List[str]] = None) -> TrainConfig:
    """Parse `argv` into a validated :class:`TrainConfig` (raises ConfigError)."""
    args = vars(build_parser().parse_args(argv))
    return TrainConfig(**args)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``hvdtrain``; returns the exit status."""
    try:
        cfg = parse_config(argv)
        train(cfg)
    except ConfigError as err:
        error_line(f"hvdtrain: error: {err}")
        return EXIT_USAGE
    except OutputError as err:
        error_line(f"hvdtrain: error: {err}")
        return EXIT_FAILED
    except NonFiniteLoss as err:
        logger.error("%s", err)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        error_line("hvdtrain: interrupted")
        return 130
    except Exception:  # pylint: disable=broad-except
        logger.exception("training failed")
        return EXIT_FAILED
    return EXIT_OK


def run() -> None:
    """Console-script wrapper.

    A failed rank leaves with ``os._exit``: the normal interpreter shutdown would run the
    stores' finalizers, which wait for peers (a ps-lite barrier, Horovod's shutdown) that
    will never come, and the job would hang instead of failing.
    """
    code = main()
    if code != EXIT_OK:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # pylint: disable=protected-access
    sys.exit(code)
