"""Every kind of metric state, reduced over 2 and 3 ranks on an uneven validation split (37
samples), reports on every rank what the same metric object reports when one process
updates it with the whole split: a composite (``mx.metric.create``), ``Loss()`` in a list,
F1 and MCC (micro: the confusion counts; macro: MXNet's mean of the batches' scores, as
one process reports it at the global batch), PCC (a confusion matrix one rank grows larger than the
others), GluonCV's SegmentationMetric and VOCMApMetric, and an MAE that a program's handler
updates itself. And MXNet's Fit API idiom ``train_metrics=[Accuracy(), Loss()]`` trains and
writes its metrics.jsonl, the metric's loss beside the run's own (``train_loss_metric``).

One job per world size (tests/dist/metric_program.py), every kind in it."""
import json
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from gluoncv.utils.metrics.segmentation import SegmentationMetric
from gluoncv.utils.metrics.voc_detection import VOCMApMetric
from mxnet import gluon

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, launcher

sys.path.insert(0, HERE)
import metric_program as program  # noqa: E402

pytestmark = pytest.mark.dist
TOLERANCE = 1e-6  # float32 losses and scores summed in another order; counts exactly


@pytest.fixture(scope="module", params=[2, 3])
def job(request, tmp_path_factory):
    """(ranks, every rank's report, rank 0's records) of one run of the program."""
    ranks = request.param
    out = tmp_path_factory.mktemp(f"metrics{ranks}")
    proc = run_command(launcher("ranks", ranks) + [sys.executable, os.path.join(
        HERE, "metric_program.py"), str(out)], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    reports = [json.load(open(out / f"rank{r}.json")) for r in range(ranks)]
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    return ranks, reports, records


def whole(name):
    """A column of the validation split as one NDArray."""
    return mx.nd.array(program.make_data(program.VAL, 2)[name])


def one_process(kind, ranks):
    """What the kind's metric object says when one process updates it with the whole split
    (a macro average: one process's batches at the global batch, each the ranks' batches of
    that number under the strided split). Returns the list of values."""
    x, y = whole("x"), whole("y")
    metric = program.metrics_of(kind)[1]
    if kind in ("composite", "f1_micro", "mcc_micro"):
        metric.update([y], [x])
    elif kind == "loss":
        accuracy, loss = metric
        accuracy.update([y], [x])
        loss.update(0, [gluon.loss.SoftmaxCrossEntropyLoss()(x, y)])
        return [accuracy.get()[1], loss.get()[1]]
    elif kind in ("f1_macro", "mcc_macro"):  # batches of the global batch, ranks x BATCH
        for first in range(0, program.VAL, ranks * program.BATCH):
            metric.update([y[first:first + ranks * program.BATCH]],
                          [x[first:first + ranks * program.BATCH]])
    elif kind == "pcc":
        metric.update([whole("mlabel")], [whole("mpred")])
    elif kind == "segmentation":
        metric.update(whole("seg_label"), whole("seg_pred"))
        return list(metric.get())
    elif kind in ("voc", "voc_tied"):  # the samples in order, as one process sees them
        scores = "det_score_tied" if kind == "voc_tied" else "det_score"
        metric.update(*(whole(n) for n in ("det_bbox", "det_id", scores, "gt_bbox",
                                           "gt_id")))
    elif kind == "mae_direct":  # one update: its mean per element, hvdtrain's value
        metric.update([whole("reg_label")], [whole("reg_pred")])
    value = metric.get()[1]
    return list(value) if isinstance(value, (list, tuple)) else [value]


FIELDS = {"composite": ["accuracy", "cross_entropy"],
          "f1_micro": ["f1"], "f1_macro": ["f1"], "mcc_micro": ["mcc"], "mcc_macro": ["mcc"],
          "pcc": ["pcc"], "segmentation": ["pixacc", "miou"], "voc": ["vocmeanap"],
          "voc_tied": ["vocmeanap"],
          "mae_direct": ["mae"]}


@pytest.mark.parametrize("kind", program.KINDS)
def test_every_rank_reports_the_whole_splits_value(job, kind):
    ranks, reports, _ = job
    want = one_process(kind, ranks)
    assert not any(np.isnan(want))
    for report in reports:
        got = report[kind]
        assert "error" not in got, got["error"]
        assert got["count"] == program.VAL and report["num_workers"] == ranks
        # The record's fields, and the user's own object (a composite's or GluonCV's get()).
        assert list(got["fields"]) == FIELDS[kind]
        assert list(got["fields"].values()) == pytest.approx(want, abs=TOLERANCE)
        assert got["own"] == pytest.approx(want, abs=TOLERANCE)
    assert all(r[kind] == reports[0][kind] for r in reports)


def test_the_fit_api_idiom_trains_and_records_the_loss_metric_beside_the_runs_loss(job):
    ranks, reports, records = job
    train = program.make_data(program.TRAIN, 1)
    x, y = mx.nd.array(train["x"]), mx.nd.array(train["y"])
    loss = gluon.loss.SoftmaxCrossEntropyLoss()(x, y).asnumpy().mean()
    accuracy = float((train["x"].argmax(1) == train["y"]).mean())
    val_accuracy, val_loss = one_process("loss", ranks)
    for report in reports:
        assert "error" not in report["fit"], report["fit"]["error"]
        assert report["fit"]["train"] == pytest.approx(
            {"accuracy": accuracy, "loss_metric": loss}, abs=TOLERANCE)
        assert report["fit"]["val"] == pytest.approx(
            {"accuracy": val_accuracy, "loss": val_loss}, abs=TOLERANCE)
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["num_workers"] == ranks and epoch["train_samples"] == program.TRAIN
    assert epoch["train_loss"] == pytest.approx(loss, abs=TOLERANCE)
    assert epoch["train_loss_metric"] == pytest.approx(loss, abs=TOLERANCE)
    assert epoch["train_accuracy"] == accuracy
    assert epoch["val_loss"] == pytest.approx(val_loss, abs=TOLERANCE)
    assert epoch["val_samples"] == program.VAL
