"""GluonCV's own segmentation code, unchanged: Fast-SCNN with its auxiliary head,
``MixSoftmaxCrossEntropyLoss(aux=True)`` and ``SegmentationMetric``, trained by hvdtrain's
Estimator at 2 ranks (segmentation_program.py) on 11 validation images (an uneven split)
whose labels ignore a border of pixels that varies by image. Every array is the same on both
ranks after every epoch, and the pixel accuracy and mIoU every rank reports are GluonCV's
metric over the whole validation split, computed here in one process with the final
weights. (Before, the metric crashed at the first validation, and given a ``sum_metric``
each rank reported its own half; and the job did not start: the program's own inference pass
before fit, to settle the net's shapes, leaves MKL-DNN's weight layouts, which the start-up
broadcast could not read, "ExecuteOperation Failed" in Horovod.)"""
import json
import os
import sys

import mxnet as mx
import numpy as np
import pytest

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

import segmentation_program as program

pytestmark = pytest.mark.dist


def one_process_metric(arrays):
    """GluonCV's SegmentationMetric over every validation image, the main head of a
    Fast-SCNN holding `arrays`, in this process."""
    from gluoncv.utils.metrics import SegmentationMetric
    net = program.make_net()
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(arrays[name]))
    metric = SegmentationMetric(program.CLASSES)
    val = program.images(program.VAL, 2)
    for first in range(0, len(val), program.BATCH):
        index = range(first, min(first + program.BATCH, len(val)))
        data = mx.nd.array(np.stack([val[i][0] for i in index]))
        label = mx.nd.array(np.stack([val[i][1] for i in index]))
        metric.update([label], [net(data)[0]])
    pixacc, miou = metric.get()
    return {"pixacc": float(pixacc), "miou": float(miou)}


def test_gluoncv_segmentation_reports_the_whole_splits_metric_on_every_rank(tmp_path):
    proc = run_command(launcher("ranks", 2) + [
        sys.executable, os.path.join(HERE, "segmentation_program.py"), str(tmp_path)],
        timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    arrays = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in (0, 1)]
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert_same_params(arrays[0], arrays[1])
    assert len(reports[0]["digests"]) == program.EPOCHS
    assert reports[0]["digests"] == reports[1]["digests"]
    want = one_process_metric(arrays[0])
    for report in reports:
        assert report["val_count"] == program.VAL
        for name, value in want.items():
            assert abs(report["val"][name] - value) <= 1e-6, (name, report["val"], want)
