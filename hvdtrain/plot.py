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

from .config import ConfigError


def load_runs(path: str) -> List[Dict]:
    """The runs in one metrics file: ``{"config": ..., "label": ..., "epochs": [...]}``."""
    runs: List[Dict] = []
    try:
        with open(path, encoding="utf-8") as src:
            records = [json.loads(line) for line in src if line.strip()]
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    except ValueError:
        raise ConfigError(f"{path} is not a metrics.jsonl file (a line is not JSON)") from None
    for record in records:
        event = record.get("event")
        if event == "start" and not (runs and record.get("start_epoch", 0) > 0):
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
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hvdtrain-plot", description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", nargs="+", help="metrics.jsonl files")
    p.add_argument("-o", "--output", default="curves.png", help="PNG to write")
    p.add_argument("--dpi", type=int, default=100)
    args = p.parse_args(argv)
    try:
        runs = [run for path in args.metrics for run in load_runs(path)]
        print(f"{plot(runs, args.output, args.dpi)}: {len(runs)} run(s)")
    except ConfigError as err:
        print(f"hvdtrain-plot: error: {err}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    sys.exit(main())
