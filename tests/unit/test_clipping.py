"""--clip-grad-norm against a plain Gluon loop that clips in NumPy, in one process.

The reference is written from the documented semantics alone: the epoch's order is
``numpy.random.default_rng([seed, epoch])``'s permutation cut into batches (``--accumulate``
micro-batches adding into one step); each step's gradient, averaged over its samples, has
its L2 norm over all parameters computed in float64 NumPy, and is multiplied by
``min(1, MAX / (norm + 1e-6))`` (torchvision's ``clip_grad_norm_``) before a plain
``gluon.Trainer`` (no store) applies it. Two ranks, buckets and float16 on the wire:
tests/dist/test_recipe.py."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.contrib.amp.loss_scaler import LossScaler

from helpers import assert_arrays_close
from plain_gluon import arrays, recorded_initialisation
from hvdtrain import job
from hvdtrain.config import TrainConfig
from hvdtrain.data.load import load_dataset
from hvdtrain.classify.build import build_loaders, build_trainer
from hvdtrain.loop.recipe.clipping import GradClipper
from hvdtrain.classify.processor import ClassifierProcessor, StepContext
from hvdtrain.loop.engine.epoch import Loop, train_epoch
from hvdtrain.loop.engine.guard import FiniteGuard
from hvdtrain.loop.engine.precision import Precision
from hvdtrain.models import build_model
from hvdtrain.state.train_state import TrainState
from hvdtrain.store.dist import DistContext

CPU = mx.cpu()
SEED, LR, MAX_NORM, BATCH = 7, 0.2, 1.0, 64
RUN = dict(model="mlp", dataset="digits", no_cuda=True, lr=LR, momentum=0.9, wd=1e-4,
           seed=SEED, log_interval=0, progress=False, batch_size=BATCH,
           clip_grad_norm=MAX_NORM)


def plain_clipped(initial, epochs, accumulate=1, max_steps=None):
    """The reference: trained arrays and each step's gradient norm before clipping."""
    data = load_dataset("digits")
    net = build_model("mlp", data.num_classes)
    net.initialize(ctx=CPU)
    net(mx.nd.zeros((1,) + data.train_x.shape[1:]))
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(initial[name]))
        param.grad_req = "add"
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": LR, "momentum": 0.9, "wd": 1e-4}, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    params = list(net.collect_params().values())
    norms = []
    for epoch in range(epochs):
        order = np.random.default_rng([SEED, epoch]).permutation(len(data.train_y))
        micro = [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
        for first in range(0, len(micro), accumulate):
            if max_steps is not None and len(norms) == max_steps:
                return arrays(net), norms
            step = micro[first:first + accumulate]
            for index in step:
                with autograd.record():
                    loss = loss_fn(net(mx.nd.array(data.train_x[index])),
                                   mx.nd.array(data.train_y[index]))
                loss.backward()
            samples = sum(len(index) for index in step)
            grads = [p.grad().asnumpy().astype(np.float64) / samples for p in params]
            norm = float(np.sqrt(sum((g * g).sum() for g in grads)))
            factor = min(1.0, MAX_NORM / (norm + 1e-6))
            for param in params:
                param.grad()[:] *= factor
            trainer.step(samples)
            for param in params:
                param.zero_grad()
            norms.append(norm)
    return arrays(net), norms


@pytest.mark.parametrize("kvstore,accumulate", [("none", 1), ("device", 1), ("device", 2)])
def test_clipping_matches_a_plain_gluon_loop_clipping_in_numpy(monkeypatch, tmp_path,
                                                               kvstore, accumulate):
    initial = recorded_initialisation(monkeypatch)
    run = job.train(TrainConfig(**RUN, kvstore=kvstore, epochs=2, accumulate=accumulate,
                                output_dir=str(tmp_path)))
    want, norms = plain_clipped(initial, 2, accumulate)
    clipped = sum(n > MAX_NORM for n in norms)
    assert 0 < clipped < len(norms)  # some steps clipped, some not: both paths taken
    ours = arrays(run.net)
    for name in want:
        assert_arrays_close(ours[name], want[name], 1e-5, what=name)
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    per_epoch = len(norms) // 2
    for record, part in zip(epochs, (norms[:per_epoch], norms[per_epoch:])):
        assert record["grad_norm_mean"] == pytest.approx(np.mean(part), rel=1e-4)
        assert record["grad_norm_max"] == pytest.approx(max(part), rel=1e-4)
        assert record["clipped_steps"] == sum(n > MAX_NORM for n in part)
        assert record["grad_norm_not_finite"] == 0


def amp_trainer(net, cfg):
    """A trainer with AMP's dynamic loss scaler, set up as ``amp.init_trainer`` does (AMP
    itself needs a GPU; its loss scaling runs anywhere)."""
    trainer = build_trainer(net, cfg, DistContext())
    trainer._amp_loss_scaler = LossScaler()  # pylint: disable=protected-access
    trainer._amp_original_scale = trainer._scale  # pylint: disable=protected-access
    return trainer


def test_clipping_measures_the_gradient_after_amps_loss_scale_is_taken_out():
    """Under AMP's loss scaling (2**16 here) backward computes scaled gradients: the norm
    and the clip are those of the unscaled, averaged gradient, as the plain loop's."""
    steps = 12
    cfg = TrainConfig(**RUN, kvstore="none")
    data = load_dataset("digits")
    net = build_model("mlp", data.num_classes)
    net.initialize(mx.init.Xavier(), ctx=CPU)
    net(mx.nd.zeros((1,) + data.train_x.shape[1:]))
    initial = arrays(net)
    trainer = amp_trainer(net, cfg)
    dist = DistContext()
    clipper = GradClipper(MAX_NORM, net, dist)
    state, policy = TrainState(), Precision(amp=True)
    loop = Loop(net, trainer, [CPU], dist, lambda _: LR, FiniteGuard(dist, CPU),
                max_steps=steps, policy=policy, clipper=clipper,
                processor=ClassifierProcessor(),
                context=StepContext(net, trainer, [CPU], dist, policy, state))
    loader, _ = build_loaders(data, cfg, dist)
    loader.sampler.set_epoch(0)
    train_epoch(loop, loader, state)
    assert trainer._amp_loss_scaler.loss_scale == 2.0 ** 16  # pylint: disable=protected-access
    want, norms = plain_clipped(initial, 1, max_steps=steps)
    ours = arrays(net)
    for name in want:
        assert_arrays_close(ours[name], want[name], 1e-5, what=name)
    figures = clipper.take()
    assert figures["grad_norm_max"] == pytest.approx(max(norms), rel=1e-4)
    assert figures["grad_norm_mean"] == pytest.approx(np.mean(norms), rel=1e-4)
