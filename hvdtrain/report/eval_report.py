"""The files an evaluation leaves in its output folder (rank 0 writes them).

    eval.json        top-1, top-5, loss and sample count, the weights evaluated
    per_class.csv    class, samples, correct, accuracy
    confusion.csv    one row per true class, one column per predicted class
    confusion.png    the same, drawn (needs matplotlib; skipped with a warning without it)
    worst.csv        the samples with the lowest probability for their true class: the
                     file (an image folder) or record (a pack), true and predicted class,
                     that probability

Each file is written whole or not at all (:func:`~hvdtrain.state.writes.atomic_write`).
"""
from __future__ import annotations

import csv
import json
import logging
import os
from typing import Callable, List

from ..state.writes import atomic_write

logger = logging.getLogger("hvdtrain")

FILES = ("eval.json", "per_class.csv", "confusion.csv", "confusion.png", "worst.csv")


def _csv(path: str, rows: List[list]) -> None:
    def write(tmp):
        with open(tmp, "w", newline="", encoding="utf-8") as out:
            csv.writer(out).writerows(rows)
    atomic_write(path, write)


def write_eval_report(folder: str, report, classes: List[str], describe: Callable[[int], str],
                      summary: dict) -> List[str]:
    """Write an :class:`~hvdtrain.loop.engine.eval_detail.EvalReport` into `folder`; `describe`
    names a sample of the split by its position; `summary` joins eval.json. Returns the
    paths written."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    record = dict(summary, top1=report.accuracy, top5=report.top5, loss=report.loss,
                  samples=report.count, correct=report.correct)

    def write_json(tmp):
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=1)
            out.write("\n")
    paths.append(atomic_write(os.path.join(folder, "eval.json"), write_json))
    per_class = [["class", "samples", "correct", "accuracy"]] + [
        [name, total, hits, f"{accuracy:.6f}"]
        for name, (total, hits, accuracy) in zip(classes, report.per_class())]
    _csv(os.path.join(folder, "per_class.csv"), per_class)
    paths.append(os.path.join(folder, "per_class.csv"))
    confusion = [["true \\ predicted"] + list(classes)] + [
        [name] + [int(v) for v in row] for name, row in zip(classes, report.confusion)]
    _csv(os.path.join(folder, "confusion.csv"), confusion)
    paths.append(os.path.join(folder, "confusion.csv"))
    worst = [["sample", "true_class", "predicted_class", "true_class_probability"]] + [
        [describe(w.position), classes[w.label], classes[w.predicted], f"{w.probability:.6g}"]
        for w in report.worst]
    _csv(os.path.join(folder, "worst.csv"), worst)
    paths.append(os.path.join(folder, "worst.csv"))
    drawn = draw_confusion(os.path.join(folder, "confusion.png"), report.confusion, classes)
    if drawn:
        paths.append(drawn)
    return paths


def draw_confusion(path: str, confusion, classes: List[str]):
    """Draw the confusion matrix, each row as shares of its true class, into `path`; None
    (and a warning) when matplotlib is not installed."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    except ImportError:
        logger.warning("confusion.png not drawn: matplotlib is not installed "
                       "(pip install matplotlib); confusion.csv has the same figures")
        return None
    rows = confusion.sum(axis=1, keepdims=True)
    shares = confusion / rows.clip(min=1)
    side = min(2 + 0.35 * len(classes), 40)
    fig, ax = plt.subplots(figsize=(side, side))
    try:  # closed whatever happens: pyplot keeps every open figure (a large one, here)
        image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
        if len(classes) <= 50:  # beyond that the names would overlap
            ax.set_xticks(range(len(classes)), classes, rotation=90)
            ax.set_yticks(range(len(classes)), classes)
        ax.set_xlabel("predicted class")
        ax.set_ylabel("true class")
        ax.set_title("confusion (share of each true class)")
        fig.colorbar(image, ax=ax, fraction=0.046)
        fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(fig)
    return path
