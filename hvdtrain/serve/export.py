"""``hvdtrain-export``: a finished run or one checkpoint, as files a server or converter reads.

    hvdtrain-export RUN_OR_CHECKPOINT OUT [--force] [--no-onnx]

rebuilds the net from the model card (:mod:`.source`, :mod:`.rebuild`), hybridizes it, runs
one forward pass of a zero batch in inference mode and writes into ``OUT``:

    model-symbol.json, model-0000.params   MXNet's deployable pair (HybridBlock.export),
                                           read by mx.gluon.SymbolBlock.imports and MXNet
                                           Model Server
    model.onnx                             the same graph for onnxruntime and other ONNX
                                           runtimes (any batch size)
    model.json                             the model card (written last: a folder holding
                                           it holds a complete export)

The input is ``data``, float32, ``(batch, channels, height, width)``, normalised as the
card's ``eval_transform`` says; the output is the logits (``hvdtrain-predict`` applies the
softmax). ``OUT`` must be new or empty; ``--force`` replaces an earlier export there (its
four files; other files are left alone). Python: ``python -m hvdtrain.serve.export``.
"""
from __future__ import annotations

import copy
import os
import sys
import time
from typing import List, Optional

import mxnet as mx

from ..config import ConfigError
from ..data.card import CARD_FILE, write_card
from ..report.log import error_line
from ..state.writes import OutputError, atomic_write, check_writable_dir, write_failure
from .command import EXIT_FAILED, EXIT_OK, Parser, run_program
from .onnx_file import OnnxUnavailable, export_onnx
from .rebuild import input_shape, rebuild
from .source import find_source

PROG = "hvdtrain-export"
PREFIX = "model"
SYMBOL, PARAMS, ONNX = f"{PREFIX}-symbol.json", f"{PREFIX}-0000.params", f"{PREFIX}.onnx"
# Removed in this order by --force: the card first, so a half-replaced folder is never
# taken for a complete export.
EXPORT_FILES = (CARD_FILE, ONNX, SYMBOL, PARAMS)


class OnnxFailed(Exception):
    """The ONNX conversion failed after the MXNet pair and the card were written."""

    def __init__(self, reason: str, written: List[str]):
        super().__init__(reason)
        self.written = written


def check_out(out: str, source_folder: str, force: bool) -> None:
    """Refuse an OUT that is a file, the source's own folder, or (without `force`) a folder
    that already holds files. Writes nothing."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(f"OUT {out} is a file, not a folder: give the folder to export into")
    if not os.path.isdir(out):
        return
    if os.path.samefile(out, source_folder):
        raise ConfigError(f"OUT {out} is the folder being exported: give another folder")
    present = sorted(os.listdir(out))
    if present and not force:
        shown = ", ".join(present[:4]) + (f" and {len(present) - 4} more" if len(present) > 4
                                          else "")
        raise ConfigError(f"OUT {out} already holds files ({shown}): give a new or empty "
                          f"folder, or --force to replace the export there")


def export(source_path: str, out: str, force: bool = False, onnx: bool = True,
           ema: bool = False) -> List[str]:
    """Export `source_path` (a run or checkpoint folder) into `out`; the files written.

    Raises ConfigError (one line) for what the user can fix, OutputError when a file cannot
    be written. An ONNX conversion that fails leaves the MXNet pair and the card written
    and raises :class:`OnnxFailed`.
    """
    source = find_source(source_path, ema)
    check_out(out, os.path.dirname(os.path.abspath(source.params)), force)
    net = rebuild(source.card, source.params)  # refuses weights that do not fit
    net.hybridize()
    net(mx.nd.zeros(input_shape(source.card)))  # inference mode: BatchNorm's running stats
    check_writable_dir(out, "OUT")
    for name in EXPORT_FILES if force else ():
        if os.path.lexists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    prefix = os.path.join(out, PREFIX)
    try:
        net.export(prefix, epoch=0)
    except Exception as err:  # a full disk: OSError, or MXNetError from its writer
        raise write_failure(prefix + "-*", err) from None
    written = [SYMBOL, PARAMS]
    failure = None
    if onnx:
        failure = _onnx(out, source.card, written)
    card = copy.deepcopy(source.card)
    card["input"]["dtype"] = "float32"  # rebuild's cast (see hvdtrain.serve.rebuild)
    card["export"] = {"from": source.describe, "files": written + [CARD_FILE],
                      "mxnet": mx.__version__}
    atomic_write(os.path.join(out, CARD_FILE), lambda path: write_card(path, card))
    written.append(CARD_FILE)
    if failure:
        raise OnnxFailed(failure, written)
    return written


def _onnx(out: str, card, written: List[str]) -> Optional[str]:
    """Convert the pair in `out`; append what was written. A missing onnx package is a
    warning (the pair is the export); a failed conversion is returned, to be raised once
    the card is written."""
    try:
        export_onnx(os.path.join(out, SYMBOL), os.path.join(out, PARAMS),
                    tuple(card["input"]["shape"]), os.path.join(out, ONNX))
    except OnnxUnavailable as err:
        error_line(f"{PROG}: warning: no {ONNX}: {err}")
        return None
    except OSError as err:
        raise write_failure(os.path.join(out, ONNX), err) from None
    except Exception as err:  # pylint: disable=broad-except  (MXNet's exporter: any kind)
        text = (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]
        return f"{type(err).__name__}: {text}"
    written.append(ONNX)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``hvdtrain-export``; returns the exit status."""
    parser = Parser(prog=PROG, description="Export a finished run (its model.params and "
                    "model.json) or one checkpoint folder as MXNet's deployable pair, ONNX "
                    "and the model card (docs/after-training.md).")
    parser.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a run's --output-dir, or a checkpoints/epoch-* folder")
    parser.add_argument("out", metavar="OUT", help="folder to write the export into")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier export in OUT (OUT may hold files)")
    parser.add_argument("--no-onnx", dest="onnx", action="store_false",
                        help="write the MXNet pair and the card only")
    parser.add_argument("--ema", action="store_true",
                        help="export the run's --ema average (model-ema.params, or a "
                        "checkpoint's ema.params) instead of its parameters")
    args = parser.parse_args(argv)

    def body() -> int:
        start = time.perf_counter()
        try:
            written = export(args.source, args.out, args.force, args.onnx, args.ema)
        except OnnxFailed as err:
            error_line(f"{PROG}: error: the ONNX conversion failed ({err}); {args.out} holds "
                       f"the MXNet pair and the card ({', '.join(err.written)}); "
                       f"--no-onnx skips the conversion")
            return EXIT_FAILED
        print(f"exported {args.source} to {args.out} in {time.perf_counter() - start:.1f} s: "
              f"{', '.join(written)}")
        return EXIT_OK
    return run_program(PROG, body)


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
