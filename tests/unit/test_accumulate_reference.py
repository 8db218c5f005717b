"""--accumulate N against an independent reference: a plain ``mxnet.gluon.Trainer``.

tests/unit/test_accumulate.py compares hvdtrain with accumulation against hvdtrain without
it, so a fault shared by both paths (the step size, the learning-rate schedule, the order of
the samples) would pass there. Here the reference is written from the documented
semantics alone, with nothing of hvdtrain's loop, store or sampler:

- a second copy of the mlp, loaded with the parameters hvdtrain's net had right after its
  initialisation (captured from ``hvdtrain.job.initialize``; the initial values are an
  input, not what is tested);
- the epoch's order is the documented shuffle, ``numpy.random.default_rng([seed, epoch])``
  over the training set, cut into micro-batches of b;
- ``grad_req='add'``, N forward/backward passes, one ``Trainer.step(samples of those N)``
  (the last step of an epoch takes the micro-batches left), then the gradients zeroed.
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from helpers import assert_arrays_close
from plain_gluon import arrays, recorded_initialisation

from hvdtrain import job
from hvdtrain.config import TrainConfig
from hvdtrain.data.load import load_dataset
from hvdtrain.models import build_model

ONE = [mx.cpu(0)]
SEED, LR, MOMENTUM, WD = 42, 0.1, 0.9, 1e-4
MICRO, N, EPOCHS = 32, 4, 2
# Plain SGD with momentum and no schedule, so that the reference needs none either.
RUN = dict(model="mlp", dataset="digits", no_cuda=True, lr=LR, momentum=MOMENTUM, wd=WD,
           seed=SEED, optimizer="sgd", log_interval=0, progress=False, batch_size=MICRO,
           accumulate=N, epochs=EPOCHS)


def hvdtrain_run(monkeypatch, kvstore):
    """hvdtrain's trained mlp and the parameters it started from."""
    initial = recorded_initialisation(monkeypatch)
    run = job.train(TrainConfig(kvstore=kvstore, **RUN), devices=ONE)
    return arrays(run.net), initial, run.result["steps"]


def reference_run(initial, accumulate=True):
    """The same training written as a user would with a plain Gluon Trainer (no kvstore).
    With `accumulate` False the gradients are overwritten by each micro-batch (grad_req
    'write'): what a broken accumulation would compute, to show the comparison tells."""
    data = load_dataset("digits")
    net = build_model("mlp", data.num_classes)  # a second, independent net
    net.initialize(ctx=ONE)
    net(mx.nd.zeros((1,) + tuple(data.train_x.shape[1:])))  # shapes, before loading values
    for name, p in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        p.set_data(mx.nd.array(initial[name]))
        if accumulate and p.grad_req != "null":
            p.grad_req = "add"
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": LR, "momentum": MOMENTUM, "wd": WD},
                            kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps = 0
    for epoch in range(EPOCHS):
        order = np.random.default_rng([SEED, epoch]).permutation(len(data.train_y))
        micro_batches = [order[i:i + MICRO] for i in range(0, len(order), MICRO)]
        for first in range(0, len(micro_batches), N):
            step = micro_batches[first:first + N]
            for index in step:
                x, y = mx.nd.array(data.train_x[index]), mx.nd.array(data.train_y[index])
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
            trainer.step(sum(len(index) for index in step))
            for p in net.collect_params().values():
                p.zero_grad()
            steps += 1
    return arrays(net), steps


@pytest.mark.parametrize("kvstore", ["device", "none"])
def test_accumulation_matches_a_plain_gluon_trainer_adding_gradients(monkeypatch, kvstore):
    """``device``: the gradients accumulate in the zero-copy buckets; ``none``: in Gluon's
    own gradient arrays."""
    trained, initial, steps = hvdtrain_run(monkeypatch, kvstore)
    reference, reference_steps = reference_run(initial)
    # 1437 samples = 45 micro-batches of 32 (the last of 29): 12 steps per epoch.
    assert steps == reference_steps == EPOCHS * 12
    assert set(trained) == set(reference)
    for name, array in trained.items():
        # Same samples, same order, same float32 sums: the two can differ only in how the
        # kernels round (a hybridized graph against imperative operators; another MKL-DNN
        # build may add a batch's per-sample terms in another order). Seen on this
        # machine's CPU build: bit-identical after 24 steps. 1e-5 per unit (absolute up to
        # magnitude 1, relative above: helpers.assert_arrays_close) is a few hundred
        # float32 roundings of headroom, while zeroing the gradients every micro-batch (a
        # broken accumulation) moves weights by up to 0.3 (the test below).
        assert_arrays_close(array, reference[name], 1e-5, what=name)


def test_the_reference_tells_a_broken_accumulation_apart(monkeypatch):
    """If the micro-batches' gradients were not added (each overwriting the last) the
    comparison above fails by far more than its tolerance."""
    trained, initial, _ = hvdtrain_run(monkeypatch, "device")
    broken, _ = reference_run(initial, accumulate=False)
    worst = max(float(np.max(np.abs(trained[k] - broken[k]))) for k in trained)
    assert worst > 1e-3, worst
