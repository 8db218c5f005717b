"""MXNet's CheckpointHandler through hvdtrain's Estimator keeps its newest
``max_checkpoints`` checkpoints by their whole names (issue 63, finding 8)."""
import os

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon.contrib.estimator import CheckpointHandler

from hvdtrain.estimator import Estimator

BATCHES, BATCH = 25, 4


def test_removing_batch1_keeps_batch10_to_19(tmp_path):
    """``batch_period=1, max_checkpoints=20`` over 25 batches: batches 6 to 25 remain
    (MXNet's own rule, a prefix, took ``epoch0batch10`` to ``19`` with ``epoch0batch1``,
    and ``20`` to ``25`` with ``epoch0batch2``)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(BATCHES * BATCH, 3)).astype(np.float32)
    y = x[:, :1] * 2
    mx.random.seed(1)
    # A prefix of its own: the global "dense" counter left alone for the tests after it.
    net = gluon.nn.Dense(1, prefix="removal_")
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    estimator = Estimator(net, gluon.loss.L2Loss(), trainer=trainer, context=mx.cpu(),
                          kvstore="none", log_interval=0)
    handler = CheckpointHandler(str(tmp_path), model_prefix="model", batch_period=1,
                                max_checkpoints=20)
    estimator.fit(gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=BATCH),
                  epochs=1, event_handlers=[handler])
    kept = sorted(f for f in os.listdir(tmp_path) if f.endswith(".params"))
    assert kept == sorted(f"model-epoch0batch{b}.params" for b in range(6, BATCHES + 1))
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".states")]) == 20
