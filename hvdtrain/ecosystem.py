"""What hvdtrain knows of other packages, in one room: their classes, attributes, versions
and messages, by name.

Standard library only and data only: nothing here imports GluonCV, GluonNLP, MXNet or
Horovod, and nothing of theirs is patched when hvdtrain is imported
(tests/unit/test_ecosystem.py). The mechanisms that act on this knowledge live in their own
rooms and read it from here:

=====================================  ==================================================
knowledge                               read by
=====================================  ==================================================
GluonCV's metrics with state of their   ``loop/engine/metric_states.py`` (the metric
own (segmentation, VOC mAP)             registry), ``loop/engine/detection_order.py``
GluonCV's losses that divide their      ``estimator/loss_divisors.py``
gradient by a count of the batch
GluonNLP's optimizers updating per      ``store/sharded.py`` (the sharded update)
element
MXNet's ``CheckpointHandler``: the      ``estimator/checkpoint_handler.py``
releases whose constructor races
Horovod's errors once a peer is gone    ``runtime/watchdog.py``, ``runtime/elastic_run.py``,
                                        ``horovod/failures.py``, ``cli.py``
=====================================  ==================================================

A class is named ``"module.QualName"`` where hvdtrain matches the exact class, or by its
package and class name where a subclass's bases are searched.
"""
from __future__ import annotations

# --- GluonCV's metrics (the metric registry: how the ranks reduce their state) ---------
# SegmentationMetric: pixel counts summed, per-class intersections and unions as arrays;
# get() returns (pixAcc, mIoU).
GLUONCV_SEGMENTATION_METRIC = "gluoncv.utils.metrics.segmentation.SegmentationMetric"
SEGMENTATION_SUMS = ("total_correct", "total_label")
SEGMENTATION_ARRAYS = ("total_inter", "total_union")
SEGMENTATION_FIELDS = ("pixacc", "miou")
# VOC mAP: per-class records, merged in the order of the samples.
GLUONCV_VOC_METRICS = ("gluoncv.utils.metrics.voc_detection.VOCMApMetric",
                       "gluoncv.utils.metrics.voc_detection.VOC07MApMetric")
VOC_POSITIVES = "_n_pos"  # per class: the ground-truth boxes counted
VOC_RECORDS = ("_score", "_match")  # per class, one entry per detection

# --- GluonCV's losses (what their gradient is already divided by) ---------------------
GLUONCV = "gluoncv"  # the package a class's module starts with
# At size_average=True with sparse labels, divided by the call's labels that are not
# ignore_label (MXNet's SoftmaxOutput, normalization='valid').
GLUONCV_SOFTMAX_FAMILY = ("SoftmaxCrossEntropyLoss", "MixSoftmaxCrossEntropyLoss",
                          "SegmentationMultiLosses", "ICNetLoss")
GLUONCV_SOFTMAX_BASE = "SoftmaxCrossEntropyLoss"
# Their settings, read from the loss object.
SOFTMAX_SIZE_AVERAGE, SOFTMAX_SPARSE_LABEL = "_size_average", "_sparse_label"
SOFTMAX_MIXUP, SOFTMAX_IGNORE_LABEL = "mixup", "_ignore_label"
# Divided by the hard pixels they keep, which hvdtrain cannot count.
GLUONCV_OHEM = ("SoftmaxCrossEntropyOHEMLoss", "MixSoftmaxCrossEntropyOHEMLoss")
# Divided by the positive anchors (cls_target > 0) of the call's device parts.
GLUONCV_SSD_LOSS = "SSDMultiBoxLoss"

# --- GluonNLP's optimizers (the sharded update: exact only for per-element updates) ---
# BERTAdam: Adam with decoupled weight decay (adamw_update).
SHARDABLE_OPTIMIZERS = ("gluonnlp.optimizer.bert_adam.BERTAdam",)

# --- MXNet's Estimator handlers --------------------------------------------------------
# MXNet 1.9's CheckpointHandler.__init__ checks whether model_dir exists, then creates it:
# ranks sharing a new folder race, and the loser's makedirs raises FileExistsError.
MXNET_RACING_CHECKPOINT_HANDLER = ("1.9.",)  # MXNet versions (prefixes) with that race

# --- Horovod ---------------------------------------------------------------------------
# Its error for a collective once its background loop stopped: a peer failed or left.
HOROVOD_SHUT_DOWN = "Horovod has been shut down"
# What MXNet reports when a Horovod operation queued in its engine failed, on Horovod
# 0.28.1 with Gloo: the message above once Horovod's loop has stopped, or Gloo's own error,
# which MXNet rewrites from "[file:line] message" into a traceback naming the message as a
# file: "Read error [127.0.0.1]" then "Connection reset by peer" (a peer killed), "Timed
# out waiting 10000ms for recv operation to complete" (a peer gone silent), "Application
# timeout caused pair closure".
HOROVOD_FAILURES = (HOROVOD_SHUT_DOWN, "/gloo/transport/", "Read error [", "Write error [",
                    "Connection reset by peer", "Connection closed by peer",
                    "Timed out waiting", "caused pair closure")
