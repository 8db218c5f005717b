"""One rank of a job that evaluates every kind of metric state hvdtrain reduces over the
ranks, each kind by an Estimator's evaluate() of its own, and fits one with MXNet's Fit API
idiom, ``train_metrics=[Accuracy(), Loss()]`` (one epoch at learning rate 0, so that the
predictions stay what the data says; metrics.jsonl written). test_metric_states.py compares
what every rank reports with the same metrics computed by one process over the whole split.

Usage: python metric_program.py OUT_DIR (under a launcher)

The net is the identity (a Dense layer whose weight is the identity matrix), so a sample's
prediction is its input: two class probabilities for a binary label. The validation split
holds VAL samples (uneven over 2 and 3 ranks), the training split TRAIN. Besides those, a
sample carries what the other metrics read, given to them by the program's own metric
handler (as GluonCV's scripts call ``metric.update`` themselves): a 4-class score and label
for PCC (class 3 only in sample 0: one rank's confusion matrix grows larger than the
others'), a segmentation's scores and labels, detections and ground truths for VOC mAP (its scores
continuous, and in three values only: tied), and a regression's predictions and labels for MAE (updated directly, not through the
Estimator). A kind that raises is reported as its error (the same on every rank) and the
job goes on. Writes OUT_DIR/rank<R>.json (per kind: the book's fields as this rank reports
them, the user's own object's get(), the validation count) and OUT_DIR/run/metrics.jsonl.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()  # GluonCV and GluonNLP live apart from the venv
from gluoncv.utils.metrics.segmentation import SegmentationMetric
from gluoncv.utils.metrics.voc_detection import VOCMApMetric

from hvdtrain.estimator import Estimator, MetricHandler

TRAIN, VAL, BATCH, SEED = 36, 37, 4, 11
CLASSES, SEG_CLASSES, HEIGHT, WIDTH = 4, 3, 4, 5
BOXES, TRUTHS, DET_CLASSES = 3, 2, 3


def make_data(count, seed):
    """Every array of `count` samples, in the dataset's order (a dict of numpy arrays)."""
    rng = np.random.default_rng([SEED, seed])
    positive = rng.random(count)  # two class probabilities (cross-entropy reads them)
    data = {"x": np.stack([1 - positive, positive], 1).astype(np.float32),
            "y": (rng.random(count) < 0.45).astype(np.float32)}
    # PCC: 4 columns of scores; class 3 only in sample 0 (label and prediction).
    scores = rng.random((count, CLASSES)).astype(np.float32)
    scores[:, 3] = -1.0
    labels = rng.integers(0, 3, count).astype(np.float32)
    scores[0, 3], labels[0] = 2.0, 3
    data["mpred"], data["mlabel"] = scores, labels
    data["seg_pred"] = rng.normal(size=(count, SEG_CLASSES, HEIGHT, WIDTH)).astype(np.float32)
    seg_label = rng.integers(-1, SEG_CLASSES, (count, HEIGHT, WIDTH))
    data["seg_label"] = seg_label.astype(np.float32)
    corner = rng.uniform(0, 60, (count, TRUTHS, 2))
    gt = np.concatenate([corner, corner + rng.uniform(10, 40, (count, TRUTHS, 2))], -1)
    data["gt_bbox"] = gt.astype(np.float32)
    data["gt_id"] = rng.integers(0, DET_CLASSES, (count, TRUTHS)).astype(np.float32)
    # Detections: near each truth (jittered), and one anywhere; scores continuous (no ties).
    near = gt[:, :, :] + rng.normal(0, 4, gt.shape)
    anywhere = np.concatenate([corner[:, :1] * 0.5, corner[:, :1] * 0.5 + 20], -1)
    data["det_bbox"] = np.concatenate([near, anywhere], 1).astype(np.float32)
    ids = np.concatenate([data["gt_id"], rng.integers(0, DET_CLASSES, (count, 1))], 1)
    flip = rng.random(ids.shape) < 0.2
    data["det_id"] = np.where(flip, (ids + 1) % DET_CLASSES, ids).astype(np.float32)
    data["det_score"] = rng.random((count, BOXES)).astype(np.float32)
    # The same, in three values only: ties, whose order decides which match counts first.
    data["det_score_tied"] = np.round(data["det_score"] * 2) / 2
    data["reg_pred"] = rng.normal(size=(count, 2)).astype(np.float32)
    data["reg_label"] = rng.normal(size=(count, 2)).astype(np.float32)
    return data


ORDER = ("x", "y", "mlabel", "mpred", "seg_pred", "seg_label", "det_bbox", "det_id",
         "det_score", "det_score_tied", "gt_bbox", "gt_id", "reg_pred", "reg_label")


class TiedVOC(VOCMApMetric):
    """VOC mAP given the tied scores (the records' order matters)."""


def dataset(count, seed):
    data = make_data(count, seed)
    return gluon.data.ArrayDataset(*(data[name] for name in ORDER))


class RoutedMetrics(MetricHandler):
    """Each metric given its part of the batch: the Estimator's update for the ones that
    read (label, pred) or the losses; ``metric.update`` called directly for the others."""

    def batch_end(self, estimator, *args, **kwargs):
        if not kwargs["pred"]:  # a step position where this rank had no sample
            return
        part = dict(zip(ORDER, kwargs["batch"]))
        for metric in self.metrics:
            if isinstance(metric, mx.metric.Loss):
                estimator.update_metric(metric, 0, kwargs["loss"])
            elif isinstance(metric, mx.metric.PCC):
                metric.update([part["mlabel"]], [part["mpred"]])
            elif isinstance(metric, SegmentationMetric):
                metric.update(part["seg_label"], part["seg_pred"])
            elif isinstance(metric, VOCMApMetric):
                scores = "det_score_tied" if isinstance(metric, TiedVOC) else "det_score"
                metric.update(part["det_bbox"], part["det_id"], part[scores],
                              part["gt_bbox"], part["gt_id"])
            elif isinstance(metric, mx.metric.MAE):
                metric.update([part["reg_label"]], [part["reg_pred"]])
            else:
                estimator.update_metric(metric, kwargs["label"], kwargs["pred"])


# "loss" (Accuracy() and Loss() at validation) is what fit's validation evaluates.
KINDS = ("composite", "f1_micro", "f1_macro", "mcc_micro", "mcc_macro", "pcc",
         "segmentation", "voc", "voc_tied", "mae_direct")


def metrics_of(kind):
    """The validation metrics of one kind, and the object whose own get() is reported."""
    made = {"composite": lambda: mx.metric.create(["acc", "ce"]),
            "loss": lambda: [mx.metric.Accuracy(), mx.metric.Loss()],
            "f1_micro": lambda: mx.metric.F1(average="micro"),
            "f1_macro": lambda: mx.metric.F1(average="macro"),
            "mcc_micro": lambda: mx.metric.MCC(average="micro"),
            "mcc_macro": lambda: mx.metric.MCC(average="macro"),
            "pcc": mx.metric.PCC, "segmentation": lambda: SegmentationMetric(SEG_CLASSES),
            "voc": lambda: VOCMApMetric(iou_thresh=0.5),
            "voc_tied": lambda: TiedVOC(iou_thresh=0.5), "mae_direct": mx.metric.MAE}[kind]()
    return (made if isinstance(made, list) else [made]), made


def trainer_of(net):
    return gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.0})


def attempt(work):
    """`work()`'s report, or the error it raised (the same on every rank: the job goes on
    to the next kind)."""
    try:
        return work()
    except Exception as err:  # pylint: disable=broad-except
        return {"error": f"{type(err).__name__}: {err}"}


def main():
    out = sys.argv[1]
    net = gluon.nn.Dense(2, in_units=2, use_bias=False)
    net.initialize()
    net.weight.set_data(mx.nd.eye(2))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    val = gluon.data.DataLoader(dataset(VAL, 2), batch_size=BATCH)
    # MXNet's Fit API idiom: [Accuracy(), Loss()], trained one epoch (at rate 0) and
    # evaluated, metrics.jsonl written.
    fitted = Estimator(net, loss, train_metrics=[mx.metric.Accuracy(), mx.metric.Loss()],
                       trainer=trainer_of(net), output_dir=os.path.join(out, "run"),
                       log_interval=0)
    report = {"num_workers": fitted.num_workers}

    def fit():
        fitted.fit(gluon.data.DataLoader(dataset(TRAIN, 1), batch_size=BATCH),
                   val_data=val, epochs=1)
        return {"train": fitted.train_book.values(), "val": fitted.val_book.values()}

    report["fit"] = attempt(fit)
    for kind in KINDS:
        def evaluate(kind=kind):
            given, own = metrics_of(kind)
            estimator = Estimator(net, loss, val_metrics=given, trainer=trainer_of(net),
                                  store=fitted.dist.store, log_interval=0)
            estimator.evaluate(val, event_handlers=[RoutedMetrics(
                metrics=estimator.val_metrics)])
            return {"fields": _fields(estimator), "own": _own(own),
                    "count": estimator.val_count}
        report[kind] = attempt(evaluate)
    with open(os.path.join(out, f"rank{fitted.rank}.json"), "w") as dump:
        json.dump(report, dump, default=float)


def _fields(estimator):
    """The validation's fields as the records name them (hvdtrain's books)."""
    book = getattr(estimator, "val_book", None)
    return book.values() if book is not None else {}


def _own(metric):
    """What the user's own object says: get()'s values (a composite's and GluonCV's)."""
    if isinstance(metric, list):
        return [float(m.get()[1]) for m in metric]
    got = metric.get()
    if isinstance(metric, SegmentationMetric):
        return [float(v) for v in got]
    values = got[1]
    return [float(v) for v in values] if isinstance(values, (list, tuple)) else [float(values)]


if __name__ == "__main__":
    main()
