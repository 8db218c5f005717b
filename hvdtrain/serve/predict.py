"""``hvdtrain-predict``: an export's top classes for image files, folders and packs, as CSV.

    hvdtrain-predict MODEL IMAGES... [--top-k K] [--batch-size B] [--threads N]
                     [--output FILE] [--onnx]

MODEL is a folder ``hvdtrain-export`` wrote (:mod:`.runtime`); IMAGES are files, folders
and ``.rec`` packs (:mod:`.inputs`). Each image goes through
:func:`hvdtrain.data.transforms.eval_transform`, the transform training evaluated with, set
from the export's model card; `--threads` threads decode while the model runs the batch
before. One CSV line per image, in input order::

    path,record,class_1,prob_1,...,class_k,prob_k,error

``record`` is the record key for a pack's images (empty for files). An image that cannot be
read or decoded gets its line with the reason in ``error`` and the rest empty, and the run
goes on. Exit status: 0 when at least one image was predicted, 1 when none could be (each
line says why), 2 for a usage error (one line: a MODEL that is no export, IMAGES with no
image). Python: ``python -m hvdtrain.serve.predict``.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List, Optional

import numpy as np

from ..config import ConfigError
from ..data.errors import BadSample
from ..data.transforms import check_jpeg_codec, eval_transform
from ..report.log import error_line
from ..state.writes import write_failure
from .command import EXIT_FAILED, EXIT_OK, Parser, run_program
from .inputs import Item, collect
from .runtime import Forward, load_export

PROG = "hvdtrain-predict"
DEFAULT_TOP_K = 5


def header(top_k: int) -> List[str]:
    ranks = [[f"class_{r}", f"prob_{r}"] for r in range(1, top_k + 1)]
    return ["path", "record"] + [name for pair in ranks for name in pair] + ["error"]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (no overflow: the row's largest logit is taken off)."""
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


class Predictor:
    """Batches of images through the export: decode on threads, forward, top-k rows."""

    def __init__(self, card: Dict, forward: Forward, top_k: int, batch_size: int,
                 threads: int):
        self.card, self.forward = card, forward
        self.classes = card["classes"]
        self.top_k = min(top_k, len(self.classes))
        self.batch_size, self.threads = batch_size, threads
        rule = card["eval_transform"]
        self.transform = dict(size=card["input"]["shape"][1], dtype=card["input"]["dtype"],
                              crop_fraction=rule["crop_fraction"], mean=rule["mean"],
                              std=rule["std"])

    def _prepare(self, item: Item, out: np.ndarray) -> Optional[str]:
        """Write `item`'s model input into `out`; None, or why it cannot be used."""
        what = item.describe()
        try:
            eval_transform(item.read(), what=what, out=out, **self.transform)
        except BadSample as err:
            text = str(err)
            return text[len(what) + 2:] if text.startswith(what + ": ") else text
        return None

    def rows(self, items: List[Item]) -> Iterator[List[str]]:
        """One CSV row per item, in order. The next batch decodes while this one runs."""
        shape = tuple(self.card["input"]["shape"])
        with ThreadPoolExecutor(self.threads, thread_name_prefix="hvdtrain-predict") as pool:
            pending = deque()
            for start in range(0, len(items), self.batch_size):
                chunk = items[start:start + self.batch_size]
                batch = np.empty((len(chunk),) + shape, self.transform["dtype"])
                pending.append((chunk, batch, [pool.submit(self._prepare, item, batch[i])
                                               for i, item in enumerate(chunk)]))
                if len(pending) > 1:
                    yield from self._finish(*pending.popleft())
            while pending:
                yield from self._finish(*pending.popleft())

    def _finish(self, chunk: List[Item], batch: np.ndarray, futures) -> Iterator[List[str]]:
        errors = [future.result() for future in futures]
        good = [i for i, error in enumerate(errors) if error is None]
        probs = softmax(self.forward(batch if len(good) == len(chunk) else batch[good])) \
            if good else None
        row_of = {i: n for n, i in enumerate(good)}
        for i, item in enumerate(chunk):
            row = [item.path, "" if item.record is None else str(item.record)]
            if errors[i] is not None:
                yield row + [""] * (2 * self.top_k) + [errors[i]]
                continue
            p = probs[row_of[i]]
            best = np.argsort(-p, kind="stable")[:self.top_k]
            yield row + [v for c in best for v in (self.classes[c], f"{p[c]:.6g}")] + [""]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Top classes and probabilities of images, from "
                    "a model hvdtrain-export wrote; one CSV line per image "
                    "(docs/after-training.md).")
    parser.add_argument("model", metavar="MODEL", help="a folder hvdtrain-export wrote")
    parser.add_argument("images", metavar="IMAGES", nargs="+",
                        help="image files, folders of them (searched recursively) or .rec "
                             "packs with their .idx")
    parser.add_argument("--top-k", type=_positive, default=DEFAULT_TOP_K,
                        help="classes per image, best first (default: 5, or the number of "
                             "classes if smaller)")
    parser.add_argument("--batch-size", type=_positive, default=32,
                        help="images per forward pass (default: 32)")
    parser.add_argument("--threads", type=_positive, default=2,
                        help="threads decoding images (default: 2)")
    parser.add_argument("--output", metavar="FILE", help="write the CSV here, not to stdout")
    parser.add_argument("--onnx", action="store_true",
                        help="run model.onnx in onnxruntime instead of the MXNet pair")
    return parser


def write_csv(predictor: Predictor, items: List[Item], out) -> int:
    """Write the CSV of `items` to `out`; the exit status."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header(predictor.top_k))
    failed = 0
    for row in predictor.rows(items):
        failed += bool(row[-1])
        writer.writerow(row)
    if failed == len(items):
        error_line(f"{PROG}: error: none of the {len(items)} images could be read or decoded "
                   f"(the error column says why)")
        return EXIT_FAILED
    if failed:
        error_line(f"{PROG}: warning: {failed} of {len(items)} images could not be read or "
                   f"decoded (the error column says why)")
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``hvdtrain-predict``; returns the exit status."""
    args = build_parser().parse_args(argv)

    def body() -> int:
        # Every refusal comes before --output is touched.
        check_jpeg_codec()
        card, forward = load_export(args.model, args.onnx)
        items = collect(args.images)
        predictor = Predictor(card, forward, args.top_k, args.batch_size, args.threads)
        try:
            if not args.output:
                return write_csv(predictor, items, sys.stdout)
            return _to_file(predictor, items, args.output)
        finally:
            for pack in {id(item.pack): item.pack for item in items if item.pack}.values():
                pack.close()
    return run_program(PROG, body)


def _to_file(predictor: Predictor, items: List[Item], path: str) -> int:
    try:
        out = open(path, "w", encoding="utf-8", newline="")
    except OSError as err:
        raise ConfigError(f"cannot write --output {path}: {err.strerror}") from None
    try:
        with out:
            return write_csv(predictor, items, out)
    except OSError as err:  # a full disk, mid-way
        raise write_failure(path, err) from None


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
