"""``--eval-only`` on 2 ranks scores every validation image once and reports what a plain
one-process Gluon loop computes over the same files, decoded and cropped independently."""
import csv
import json
import os

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from helpers import run_command, tool
from hvdtrain.models import build_model
from jobs import launcher

pytestmark = pytest.mark.dist

# More than five classes, so that top-5 can miss (of three, every label is in the top 5).
CLASSES = ("ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "kiwi",
           "lynx")
MEAN = np.array([0.485, 0.456, 0.406], np.float32)  # ImageNet's, as torchvision states them
STD = np.array([0.229, 0.224, 0.225], np.float32)
FLAGS = ["--dataset", "imagefolder", "--image-size", "28", "--model", "pool_cnn", "--no-cuda",
         "--log-interval", "0"]


def write_images(root):
    """32x32 PNGs, each class tinted its own way (so that one epoch learns something); the
    evaluation's centre crop of 28/32 = 0.875 is then pixels 2..29, with no resize."""
    rng = np.random.default_rng(1)
    for split, count in (("train", 24), ("val", 7)):
        for label, name in enumerate(CLASSES):
            os.makedirs(os.path.join(root, split, name))
            for i in range(count):
                pixels = rng.integers(0, 120, (32, 32, 3))
                # A channel and a strength per class: neighbours are easily confused.
                pixels[..., label % 3] += 20 + 25 * (label // 3)
                Image.fromarray(pixels.astype(np.uint8)).save(
                    os.path.join(root, split, name, f"{i:02d}.png"))
    open(os.path.join(root, "val", "bee", "99-empty.png"), "wb").close()


def reference(run, root):
    """The confusion matrix and the top-5 hits of a plain Gluon net holding the run's
    parameters, over the usable validation files, decoded with Pillow."""
    net = build_model("pool_cnn", len(CLASSES))
    net.load_parameters(os.path.join(run, "model.params"), ctx=mx.cpu())
    confusion, top5 = np.zeros((len(CLASSES), len(CLASSES)), int), 0
    for label, name in enumerate(CLASSES):
        folder = os.path.join(root, "val", name)
        for file in sorted(os.listdir(folder)):
            if not os.path.getsize(os.path.join(folder, file)):
                continue
            pixels = np.asarray(Image.open(os.path.join(folder, file)).convert("RGB"),
                                np.float32)[2:30, 2:30] / 255
            x = ((pixels - MEAN) / STD).transpose(2, 0, 1)[None]
            scores = net(mx.nd.array(x)).asnumpy()[0]
            confusion[label, int(scores.argmax())] += 1
            top5 += label in np.argsort(-scores)[:5]
    return confusion, top5


def test_two_ranks_report_what_a_plain_loop_computes(tmp_path):
    root, run, out = str(tmp_path / "images"), str(tmp_path / "run"), str(tmp_path / "eval")
    write_images(root)
    proc = run_command([tool("hvdtrain")] + FLAGS + ["--data-dir", root, "--epochs", "1",
                                                    "--max-bad-samples", "1",
                                                    "--output-dir", run], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    # No --image-size: the size comes from the run's model card (28), as --model does.
    proc = run_command(launcher("ranks") + [tool("hvdtrain")] + [
        "--eval-only", "--init-from", run, "--dataset", "imagefolder", "--data-dir", root,
        "--no-cuda", "--max-bad-samples", "1", "--output-dir", out],
        timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = json.load(open(os.path.join(out, "eval.json")))
    expected, top5 = reference(run, root)
    count = 7 * len(CLASSES)
    assert summary["num_workers"] == 2 and summary["model"] == "pool_cnn"
    assert summary["input_shape"] == [3, 28, 28]
    assert summary["samples"] == count and summary["skipped_samples"] == 1
    assert summary["correct"] == np.trace(expected)
    assert summary["top1"] == pytest.approx(np.trace(expected) / count)
    assert 0 < top5 < count, top5  # the check bites: top-5 misses some, not all
    assert summary["top5"] == pytest.approx(top5 / count)
    rows = list(csv.reader(open(os.path.join(out, "confusion.csv"))))
    assert [[int(v) for v in row[1:]] for row in rows[1:]] == expected.tolist()
    per_class = list(csv.reader(open(os.path.join(out, "per_class.csv"))))
    assert [int(r[1]) for r in per_class[1:]] == [7] * len(CLASSES)
    worst = list(csv.reader(open(os.path.join(out, "worst.csv"))))
    assert len(worst) == 21 and all(r[0].startswith(os.path.join(root, "val")) for r in worst[1:])
    assert "Traceback" not in proc.stdout
    # Another size than the card's is refused, not scored.
    proc = run_command([tool("hvdtrain"), "--eval-only", "--init-from", run, "--dataset",
                        "imagefolder", "--data-dir", root, "--image-size", "32", "--no-cuda"],
                       timeout=300)
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert "trained on 28x28 images (its model card), not --image-size 32" in lines[0]
