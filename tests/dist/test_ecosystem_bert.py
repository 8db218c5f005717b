"""GluonNLP's own code, unchanged: a tiny BERT classifier (``BERTEncoder``, ``BERTModel``,
``BERTClassifier``) batched by GluonNLP's ``FixedBucketSampler`` and padded by its batchify,
trained by hvdtrain's Estimator at 2 ranks (bert_program.py), against a plain one-process
Gluon loop written here: each step the union of the two ranks' batches (drawn as
docs/data.md defines it), the summed gradient divided by their total sample count. The
weights agree (1e-5: the ranks sum partial gradients in another order), the metrics every
rank reports are the plain loop's over the whole split, and every array is the same on both
ranks after every epoch."""
import json
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from helpers import assert_arrays_close, run_command
from jobs import HERE, JOB_TIMEOUT, launcher

import bert_program as program
from bucket_steps import drawn, steps_of

pytestmark = pytest.mark.dist
RANKS = 2


def plain_loop(start):
    """One process: SGD with momentum, each step both ranks' batches, divided by their
    sample count. Returns (its arrays, the last epoch's training accuracy, the validation
    accuracy over the whole split)."""
    train, val = program.make_data(program.TRAIN, 1), program.make_data(program.VAL, 2)
    net, batchify = program.make_net(), program.batchify()
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(start[name]))
        param.grad_req = "add"
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": program.LR,
                                                          "momentum": 0.9})
    step, trained = 0, None
    for epoch in range(program.EPOCHS):
        trained = mx.metric.Accuracy()
        batches = drawn(lambda: program.bucket_sampler(train, True), epoch, program.SEED)
        for group in steps_of(batches, lambda _: RANKS, step):
            net.collect_params().zero_grad()
            for batch in group:
                with autograd.record():
                    pred, label = program.forward(net, batchify([train[i] for i in batch]))
                    loss = loss_fn(pred, label)
                loss.backward()
                trained.update([label], [pred])
            trainer.step(sum(len(batch) for batch in group))
            step += 1
    scored = mx.metric.Accuracy()
    for batch in program.bucket_sampler(val, False):
        pred, label = program.forward(net, batchify([val[i] for i in batch]))
        scored.update([label], [pred])
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    return arrays, trained.get()[1], scored.get()[1]


def test_a_gluonnlp_bert_classifier_on_a_bucket_sampler_trains_as_one_process(tmp_path):
    proc = run_command(launcher("ranks", RANKS) + [sys.executable,
                                                   os.path.join(HERE, "bert_program.py"),
                                                   str(tmp_path)], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    arrays = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(RANKS)]
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(RANKS)]
    start = dict(np.load(tmp_path / "rank0-start.npz"))
    want, trained, validated = plain_loop(start)
    for name, value in want.items():
        assert_arrays_close(arrays[0][name], value, 1e-5, what=name)
    assert sum(not np.array_equal(arrays[0][n], start[n]) for n in start) > len(start) // 2
    for report in reports:
        assert report["val_count"] == program.VAL
        assert abs(report["metrics"]["training accuracy"] - trained) < 1e-6, (report, trained)
        assert abs(report["metrics"]["validation accuracy"] - validated) < 1e-6, \
            (report, validated)
    assert len(reports[0]["digests"]) == program.EPOCHS
    assert reports[0]["digests"] == reports[1]["digests"]  # every array, every epoch
