"""``hvdtrain-plot``: learning curves and throughput from metrics.jsonl files.

    hvdtrain-plot runs/a/metrics.jsonl -o curves.png
    hvdtrain-plot runs/horovod/metrics.jsonl runs/ps/metrics.jsonl -o compare.png

Each file may hold several runs (one per ``start`` record; a resumed run continues the
run before it). Every run becomes one line per panel: loss (train solid, test dashed),
accuracy (the same) and global samples/s per epoch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List

from ..config import ConfigError


# Fields of an epoch record the plot reads: (name, required). Each must be a number.
EPOCH_FIELDS = (("epoch", True), ("samples_per_sec", True), ("train_loss", False),
                ("test_loss", False), ("train_acc", False), ("test_acc", False))
MAX_DPI = 1000  # 15 x 4.5 inches at this dpi is already 15000 x 4500 pixels


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_records(path: str) -> List[Dict]:
    """The JSON objects of a metrics file, each checked enough to be plotted."""
    records = []
    try:
        with open(path, encoding="utf-8") as src:
            lines = list(src)
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a metrics.jsonl file (not text)") from None
    damaged = []  # lines that are not JSON at all, e.g. cut short by a crash mid-write
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except ValueError:
            damaged.append(where)
            continue
        if not isinstance(record, dict):
            raise ConfigError(f"{where} is a JSON {type(record).__name__}, not a record "
                              "object: not a metrics.jsonl file")
        if record.get("event") == "epoch":
            for name, required in EPOCH_FIELDS:
                value = record.get(name)
                if (value is None and required) or (value is not None and not _is_number(value)):
                    raise ConfigError(f"{where}: epoch record needs a number in {name!r}, got "
                                      f"{json.dumps(value)}")
        if record.get("event") == "start" and not isinstance(record.get("config", {}), dict):
            raise ConfigError(f"{where}: start record's 'config' is not an object")
        records.append(record)
    if damaged and not records:
        raise ConfigError(f"{damaged[0]} is not JSON: not a metrics.jsonl file")
    if damaged:
        print(f"hvdtrain-plot: warning: {path}: skipped {len(damaged)} damaged line(s) "
              f"that are not JSON (first: line {damaged[0].rsplit(' ', 1)[1]})",
              file=sys.stderr)
    return records


def load_runs(path: str) -> List[Dict]:
    """The runs in one metrics file: ``{"config": ..., "label": ..., "epochs": [...]}``."""
    runs: List[Dict] = []
    for record in _read_records(path):
        event = record.get("event")
        resumed = _is_number(record.get("start_epoch")) and record["start_epoch"] > 0
        if event == "start" and not (runs and resumed):
            config = record.get("config", {})
            runs.append({"config": config, "num_workers": record.get("num_workers"),
                         "label": run_label(config, record.get("num_workers")), "epochs": []})
        elif event == "epoch":
            if not runs:
                runs.append({"config": {}, "label": os.path.basename(path), "epochs": []})
            runs[-1]["epochs"].append(record)
    if not any(run["epochs"] for run in runs):
        raise ConfigError(f"{path} holds no epoch records")
    return [run for run in runs if run["epochs"]]


def run_label(config: Dict, num_workers) -> str:
    model = config.get("model") or ("simple_cnn" if config.get("dataset") == "digits"
                                    else "resnet18_v1")
    return (f"{model} on {config.get('dataset', '?')}, {config.get('kvstore', '?')}, "
            f"{num_workers} x batch {config.get('batch_size', '?')}, lr {config.get('lr', '?')}")


def plot(runs: List[Dict], out: str, dpi: int = 100) -> str:
    """Draw `runs` into the PNG `out` (1500 x 450 pixels at the default dpi)."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ConfigError("hvdtrain-plot needs matplotlib: pip install matplotlib (make install does)") \
            from None
    fig, (loss_ax, acc_ax, speed_ax) = plt.subplots(1, 3, figsize=(15, 4.5), dpi=dpi)
    for index, run in enumerate(runs):
        color = f"C{index % 10}"
        epochs = [e["epoch"] + 1 for e in run["epochs"]]
        for key, style, axis in (("train_loss", "-", loss_ax), ("test_loss", "--", loss_ax),
                                 ("train_acc", "-", acc_ax), ("test_acc", "--", acc_ax)):
            values = [e.get(key) for e in run["epochs"]]
            if all(v is not None for v in values):
                axis.plot(epochs, values, style, color=color,
                          label=f"{key.split('_')[0]}: {run['label']}" if axis is acc_ax
                          else None)
        speed_ax.plot(epochs, [e["samples_per_sec"] for e in run["epochs"]], "o-", color=color)
    for axis, title in ((loss_ax, "loss (train solid, test dashed)"),
                        (acc_ax, "accuracy (train solid, test dashed)"),
                        (speed_ax, "global samples/s")):
        axis.set_title(title)
        axis.set_xlabel("epoch")
        axis.grid(alpha=0.3)
    acc_ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(runs[0]["label"] if len(runs) == 1 else f"{len(runs)} runs compared")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=dpi)
    finally:  # a failed write keeps no figure open
        plt.close(fig)
    return out


def check_output(path: str, dpi: int) -> None:
    """Refuse, before any work, an image that cannot be written: a missing folder, a format
    matplotlib cannot write, a dpi out of range."""
    if not 0 < dpi <= MAX_DPI:
        raise ConfigError(f"--dpi must be in [1, {MAX_DPI}], got {dpi}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"-o {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"-o {path} is a folder; give an image file name")
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    formats = supported_formats()
    if suffix not in formats:
        what = f".{suffix}" if suffix else "a name without an extension"
        raise ConfigError(f"-o {path}: cannot write {what}; use one of "
                          + ", ".join(f".{f}" for f in formats))


def supported_formats() -> List[str]:
    """Image formats matplotlib's Agg backend writes (png, pdf, svg, ...)."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ConfigError("hvdtrain-plot needs matplotlib: pip install 'hvdtrain[plot]'") \
            from None
    return sorted(FigureCanvasBase.get_supported_filetypes())


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None) -> int:
    p = _Parser(prog="hvdtrain-plot", description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", nargs="+", help="metrics.jsonl files")
    p.add_argument("-o", "--output", default="curves.png",
                   help="image to write; the extension picks the format (.png, .pdf, .svg, ...)")
    p.add_argument("--dpi", type=int, default=100, help=f"1 to {MAX_DPI} (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        check_output(args.output, args.dpi)
        runs = [run for path in args.metrics for run in load_runs(path)]
        try:
            written = plot(runs, args.output, args.dpi)
        except OSError as err:
            raise ConfigError(f"cannot write {args.output}: {err.strerror}") from None
        print(f"{written}: {len(runs)} run(s)")
    except ConfigError as err:
        print(f"hvdtrain-plot: error: {err}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    sys.exit(main())
