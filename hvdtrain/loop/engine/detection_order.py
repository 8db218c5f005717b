"""Detection records (GluonCV's VOC mAP) merged in sample order, not rank by rank.

VOC mAP sorts each class's detections by score, and with tied scores the order the records
arrived in decides which match counts first: one process sees the samples in order, while
records concatenated rank by rank put rank 0's samples before rank 1's. With tied scores
the reported mAP differed from one process's on the same weights (0.00839 against 0.00694).

So the metric's own update also notes, for each class, which of this rank's samples each
record came from (the n-th sample it was given). At the reduction every rank's records are
put back in the order of the samples: under a strided split (rank r's n-th sample is the
split's ``r + N n``-th) by (n, rank); under a contiguous split (rank r holds a block of
its own) by (rank, n), which is rank order.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import mxnet as mx
import numpy as np

from ...ecosystem import VOC_POSITIVES, VOC_RECORDS
from .element_errors import _Bound

SAMPLES = "_hvdtrain_samples"  # per class: the sample number of each record, in order
SEEN = "_hvdtrain_seen"  # samples this rank's metric was given since its reset
RECORDS = VOC_RECORDS  # per class, one entry per detection


def keep_sample_order(metric) -> None:
    """Make `metric`'s own update note each record's sample, and its reset forget (once)."""
    if SAMPLES in vars(metric):
        return
    setattr(metric, SAMPLES, {})
    setattr(metric, SEEN, 0)
    metric.update = _Bound(_updated, metric)
    metric.reset = _Bound(_reset, metric)


def _as_numpy(value):
    if isinstance(value, (list, tuple)):
        parts = [v.asnumpy() if isinstance(v, mx.nd.NDArray) else np.asarray(v) for v in value]
        return np.concatenate(parts, axis=0)
    return value.asnumpy() if isinstance(value, mx.nd.NDArray) else np.asarray(value)


def _updated(metric, pred_bboxes, pred_labels, *args, **kwargs):
    type(metric).update(metric, pred_bboxes, pred_labels, *args, **kwargs)
    samples: Dict[int, List[int]] = getattr(metric, SAMPLES)
    seen = getattr(metric, SEEN)
    labels = _as_numpy(pred_labels)
    # VOC's update adds, for each sample, one record per valid detection to its class.
    for row in labels.reshape(len(labels), -1):
        classes, counts = np.unique(row[row >= 0].astype(int), return_counts=True)
        for label, count in zip(classes.tolist(), counts.tolist()):
            samples.setdefault(label, []).extend([seen] * count)
        seen += 1
    setattr(metric, SEEN, seen)


def _reset(metric):
    type(metric).reset(metric)
    setattr(metric, SAMPLES, {})
    setattr(metric, SEEN, 0)


def merge_in_sample_order(metric, ranks: List[dict], strided: bool) -> Optional[dict]:
    """Every rank's records (``ranks[r]``: path -> value, as the registry names them) as
    one process would hold them, or None when a rank's notes do not match its records (a
    subclass that adds records otherwise: then they are merged rank by rank). Counts
    (``_n_pos``) are summed."""
    for held in ranks:
        for path in RECORDS:
            for label, records in held[path].items():
                if len(records) != len(held[SAMPLES].get(label, ())):
                    return None
    out = {path: ranks[0][path].copy() for path in (VOC_POSITIVES,) + RECORDS}
    for path in RECORDS:
        out[path].clear()
    for other in ranks[1:]:
        for label, count in other[VOC_POSITIVES].items():
            out[VOC_POSITIVES][label] = out[VOC_POSITIVES].get(label, 0) + count
    out[SAMPLES] = {}
    labels = sorted({label for held in ranks for label in held[SAMPLES]})
    for label in labels:
        entries = []  # (sort key, note, score, match)
        for rank, held in enumerate(ranks):
            notes = held[SAMPLES].get(label, [])
            for at, (note, score, match) in enumerate(zip(
                    notes, *(held[r].get(label, []) for r in RECORDS))):
                key = (note, rank, at) if strided else (rank, note, at)
                entries.append((key, note, score, match))
        entries.sort(key=lambda entry: entry[0])
        for at, record in enumerate(RECORDS, start=2):
            out[record][label] = [entry[at] for entry in entries]
        out[SAMPLES][label] = [entry[1] for entry in entries]
    return out
