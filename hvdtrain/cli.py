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
from . import options as optmod
from .config import ConfigError, TrainConfig
from .report.log import error_line
from .ecosystem import HOROVOD_SHUT_DOWN

logger = logging.getLogger("hvdtrain")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DIVERGED = 0, 1, 2, 3
EXIT_PREEMPTED = cfgmod.EXIT_PREEMPTED  # stopped by a signal, checkpoint saved: run it again

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


def _parser_type(parse):
    """argparse wants ArgumentTypeError for a one-line usage error."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return convert


def _add_option(group, spec) -> None:
    """Add one option of :class:`TrainConfig` to the parser, as its definition says."""
    meta = spec.metadata
    help_text = meta["help"].replace("%", "%%")
    kind = meta["kind"]
    flag = optmod.flags_of(spec)[0]
    if kind == "switch":
        group.add_argument(flag, dest=spec.name, action="store_true", help=help_text)
        return
    if kind == "off-switch":
        group.add_argument(flag, dest=spec.name, action="store_false", help=help_text)
        return
    if kind == "on-off":
        group.add_argument(flag, dest=spec.name, action=_OnOffFlag, default=None,
                           help=help_text)
        return
    default = optmod.default_of(spec)
    shown = optmod.shown_default(spec)
    if optmod.describe_range(spec):
        help_text += f" ({optmod.describe_range(spec)})"
    if shown:
        help_text += f" (default: {shown})".replace("%", "%%")
    parse = optmod.parse_of(spec)
    kwargs = {"dest": spec.name, "default": default, "help": help_text,
              "metavar": meta["metavar"]}
    if parse is not None:  # int and float keep argparse's own "invalid int value" line
        kwargs["type"] = parse if parse in (int, float) else _parser_type(parse)
    if meta["choices"]:
        kwargs["choices"] = meta["choices"]
        kwargs.pop("metavar")
    group.add_argument(flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, made from the option definitions of :class:`TrainConfig`."""
    p = _Parser(prog="hvdtrain", description=(
        "Data-parallel training of MXNet Gluon models with Horovod ring-allreduce. "
        "Run one process per device under horovodrun or mpirun; without a launcher it "
        "trains as a single worker."),
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {name: p.add_argument_group(name) for name in optmod.GROUPS}
    for spec in cfgmod.options():
        _add_option(groups[spec.metadata["group"]], spec)
    return p


def parse_config(argv: Optional[List[str]] = None) -> TrainConfig:
    """Parse `argv` into a validated :class:`TrainConfig` (raises ConfigError)."""
    args = vars(build_parser().parse_args(argv))
    return TrainConfig(**args)


def train(cfg: TrainConfig):
    """Train as `cfg` says (:func:`hvdtrain.job.train`). Imported here, not at the top: the
    training modules import MXNet (1.3 s of a core), which ``--help`` and a refused flag do
    not need."""
    from .job import train as train_job  # pylint: disable=import-outside-toplevel
    return train_job(cfg)


def evaluate_only(cfg: TrainConfig):
    """Evaluate a checkpoint as `cfg` says (:func:`hvdtrain.eval_job.evaluate_only`)."""
    from .eval_job import evaluate_only as evaluate  # pylint: disable=import-outside-toplevel
    return evaluate(cfg)


def __getattr__(name):
    if name == "Run":  # re-exported: ``from hvdtrain.cli import Run``
        from .job import Run  # pylint: disable=import-outside-toplevel
        return Run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``hvdtrain``; returns the exit status."""
    try:
        cfg = parse_config(argv)
    except ConfigError as err:
        error_line(f"hvdtrain: error: {err}")
        return EXIT_USAGE
    return _run(cfg)


def _run(cfg: TrainConfig) -> int:
    """Train or evaluate as `cfg` says; return the exit status."""
    # pylint: disable=import-outside-toplevel
    from .store.agree import AgreedConfigError, AgreedError, FaultInjected
    from .loop.engine.guard import NonFiniteLoss
    from .loop.run.together import StoppedTogether
    from .state.writes import OutputError
    try:
        if cfg.eval_only:
            evaluate_only(cfg)
        else:
            train(cfg)
    except (AgreedError, AgreedConfigError) as err:  # the same line on every rank
        error_line(f"hvdtrain: error: {err}")
        err.leave()
        return err.status
    except ConfigError as err:
        error_line(f"hvdtrain: error: {err}")
        return EXIT_USAGE
    except OutputError as err:
        error_line(f"hvdtrain: error: {err}")
        return EXIT_FAILED
    except StoppedTogether as err:  # a failed write, or a stop asked for (Preempted)
        if err.line:
            error_line(err.line)
        err.leave()
        return err.status
    except FaultInjected as err:  # tests only (store/sites.py): one line, as any failure
        error_line(f"hvdtrain: error: {err}")
        return EXIT_FAILED
    except NonFiniteLoss as err:
        logger.error("%s", err)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        error_line("hvdtrain: interrupted")
        return 130
    except Exception as err:  # pylint: disable=broad-except
        if HOROVOD_SHUT_DOWN in str(err):
            # Another rank failed (its own line says why) or vanished, and Horovod stopped
            # every collective: this rank's traceback would say nothing more.
            error_line(f"hvdtrain: error: {HOROVOD_SHUT_DOWN}: another rank failed "
                       f"or left the job (see its output)")
            return EXIT_FAILED
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
