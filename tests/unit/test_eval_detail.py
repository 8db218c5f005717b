"""Detailed evaluation against NumPy on a linear model, and the files it writes."""
import csv
import json
import os

import mxnet as mx
import numpy as np
import pytest

from hvdtrain.data.loader import BatchLoader
from hvdtrain.data.sampler import SplitSampler
from hvdtrain.classify.eval_detail import evaluate_detailed
from hvdtrain.report.eval_report import write_eval_report
from hvdtrain.store.dist import DistContext

CLASSES = 7


@pytest.fixture(scope="module")
def linear_case():
    """A Dense layer with known weights over 53 random samples (batches of 8, the last short)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((53, 12)).astype(np.float32)
    y = rng.integers(0, CLASSES, 53).astype(np.int32)
    w = rng.standard_normal((CLASSES, 12)).astype(np.float32)
    b = rng.standard_normal(CLASSES).astype(np.float32)
    net = mx.gluon.nn.Dense(CLASSES, in_units=12)
    net.initialize()
    net.weight.set_data(mx.nd.array(w))
    net.bias.set_data(mx.nd.array(b))
    loader = BatchLoader(x, y, SplitSampler(len(y), pad=False), 8, data_workers=0)
    report = evaluate_detailed(net, loader, [mx.cpu()], DistContext(), CLASSES, worst=5)
    return x @ w.T + b, y, report


def test_every_figure_matches_numpy(linear_case):
    logits, y, report = linear_case
    predicted = logits.argmax(axis=1)
    confusion = np.zeros((CLASSES, CLASSES), int)
    for t, p in zip(y, predicted):
        confusion[t, p] += 1
    assert (report.confusion == confusion).all()
    assert report.count == 53 and report.accuracy == pytest.approx((predicted == y).mean())
    top5 = np.argsort(-logits, axis=1)[:, :5]
    assert report.top5_correct == int((top5 == y[:, None]).any(axis=1).sum())
    log_probs = logits - logits.max(axis=1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
    losses = -log_probs[np.arange(53), y]
    assert report.loss == pytest.approx(losses.mean(), rel=1e-5)
    order = np.argsort(-losses)[:5]
    assert [w.position for w in report.worst] == order.tolist()
    assert [w.probability for w in report.worst] == pytest.approx(np.exp(-losses[order]),
                                                                  rel=1e-4)
    assert [w.predicted for w in report.worst] == predicted[order].tolist()


def test_the_report_files_say_the_same(linear_case, tmp_path):
    _, y, report = linear_case
    classes = [f"c{i}" for i in range(CLASSES)]
    written = write_eval_report(str(tmp_path), report, classes, lambda i: f"sample-{i}",
                                {"weights": "w.params"})
    assert {os.path.basename(p) for p in written} == {
        "eval.json", "per_class.csv", "confusion.csv", "worst.csv", "confusion.png"}
    summary = json.load(open(tmp_path / "eval.json"))
    assert summary["samples"] == 53 and summary["top1"] == report.accuracy
    assert summary["weights"] == "w.params"
    rows = list(csv.reader(open(tmp_path / "per_class.csv")))
    assert rows[0] == ["class", "samples", "correct", "accuracy"]
    assert [int(r[1]) for r in rows[1:]] == np.bincount(y, minlength=CLASSES).tolist()
    matrix = list(csv.reader(open(tmp_path / "confusion.csv")))
    assert matrix[0][1:] == classes
    assert np.array([[int(v) for v in r[1:]] for r in matrix[1:]]).tolist() == \
        report.confusion.tolist()
    worst = list(csv.reader(open(tmp_path / "worst.csv")))
    assert len(worst) == 6 and worst[1][0] == f"sample-{report.worst[0].position}"
    with open(tmp_path / "confusion.png", "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_confusion_drawing_that_cannot_be_written_leaves_no_figure_open(tmp_path):
    """pyplot keeps every figure until it is closed: a write that fails (a full disk, a
    folder gone) must not leave the drawing behind."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from hvdtrain.report.eval_report import draw_confusion
    from hvdtrain.state.writes import OutputError
    before = len(plt.get_fignums())
    with pytest.raises(OutputError):
        draw_confusion(str(tmp_path / "gone" / "confusion.png"), np.eye(3), ["a", "b", "c"])
    assert len(plt.get_fignums()) == before
