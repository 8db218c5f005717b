"""VOC mAP's records merged in the order of the samples (loop/engine/detection_order.py),
with GluonCV's own metric: one process's records over the whole split, whichever split."""
import os
import sys
from collections import defaultdict

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()
voc = pytest.importorskip("gluoncv.utils.metrics.voc_detection")

from hvdtrain.loop.engine.detection_order import (  # noqa: E402
    SAMPLES, keep_sample_order, merge_in_sample_order)

SAMPLES_N, BOXES = 9, 3


def _data():
    rng = np.random.default_rng(5)
    gt = rng.uniform(0, 50, (SAMPLES_N, 2, 2))
    gt = np.concatenate([gt, gt + 20], -1)
    labels = rng.integers(0, 2, (SAMPLES_N, 2)).astype(float)
    boxes = np.concatenate([gt, gt[:, :1] + 3], 1)
    ids = np.concatenate([labels, rng.integers(0, 2, (SAMPLES_N, 1))], 1)
    scores = np.round(rng.random((SAMPLES_N, BOXES)) * 2) / 2  # ties
    return boxes, ids, scores, gt, labels


def _update(metric, rows):
    boxes, ids, scores, gt, labels = _data()
    for row in rows:  # one sample a batch, as a rank's loader might give them
        metric.update(boxes[row:row + 1], ids[row:row + 1], scores[row:row + 1],
                      gt[row:row + 1], labels[row:row + 1])


def _records(metric):
    return {"_n_pos": metric._n_pos, "_score": metric._score, "_match": metric._match,
            SAMPLES: getattr(metric, SAMPLES)}


@pytest.mark.parametrize("strided", [True, False])
def test_two_ranks_records_merge_into_one_processs(strided):
    whole = voc.VOCMApMetric(iou_thresh=0.5)
    _update(whole, range(SAMPLES_N))
    parts = ([list(range(r, SAMPLES_N, 2)) for r in (0, 1)] if strided else
             [list(range(0, 5)), list(range(5, SAMPLES_N))])
    ranks = []
    for rows in parts:
        metric = voc.VOCMApMetric(iou_thresh=0.5)
        keep_sample_order(metric)
        _update(metric, rows)
        ranks.append(_records(metric))
    merged = merge_in_sample_order(None, ranks, strided)
    for label in whole._score:
        assert list(merged["_score"][label]) == list(whole._score[label])
        assert list(merged["_match"][label]) == list(whole._match[label])
        assert merged["_n_pos"][label] == whole._n_pos[label]
    # Rank by rank (what the registry did before) is another order under a strided split.
    joined = {label: list(ranks[0]["_score"].get(label, [])) + list(ranks[1]["_score"].get(
        label, [])) for label in whole._score}
    assert (joined == {k: list(v) for k, v in whole._score.items()}) != strided


def test_records_without_notes_keep_rank_order():
    metric = voc.VOCMApMetric(iou_thresh=0.5)
    _update(metric, range(3))  # no notes taken
    records = _records_without_notes(metric)
    assert merge_in_sample_order(None, [records, records], True) is None


def _records_without_notes(metric):
    out = {"_n_pos": metric._n_pos, "_score": metric._score, "_match": metric._match}
    out[SAMPLES] = defaultdict(list)
    return out
