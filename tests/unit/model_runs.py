"""Run folders of image models made without training, for the export and predict tests.

A model is randomly initialised, then its BatchNorm layers get running statistics, scales and
shifts far from their defaults (mean 0, variance 1), so that inference mode (running
statistics) and training mode (batch statistics) give clearly different outputs and a
runtime that mixed them up would be caught. The folder holds what a finished ``hvdtrain``
run leaves: ``model.params`` (Gluon ``save_parameters``) and ``model.json`` (its card).
"""
import os

import mxnet as mx
import numpy as np

from hvdtrain.data.card import model_card, write_card
from hvdtrain.data.sampler import SplitSampler
from hvdtrain.data.streamed import ImageLoader
from hvdtrain.models import build_model


def set_batchnorm(net, seed=0):
    """Non-trivial running statistics, scales and shifts in every BatchNorm layer."""
    rng = np.random.default_rng(seed)
    draws = {"running_mean": lambda shape: rng.normal(0, 0.5, shape),
             "running_var": lambda shape: rng.uniform(0.3, 3.0, shape),
             "gamma": lambda shape: rng.uniform(0.5, 1.5, shape),
             "beta": lambda shape: rng.normal(0, 0.3, shape)}
    changed = 0
    for name, param in net.collect_params().items():
        for suffix, draw in draws.items():
            if name.endswith(suffix):
                param.set_data(mx.nd.array(draw(param.shape)))
                changed += 1
    assert changed, "no BatchNorm parameter found"


def make_run(folder, model, data, classes=None, output_scale=1.0, seed=0):
    """Write a run folder for `model` on `data` (a loaded image dataset); the Gluon net.

    `classes` overrides the output width (a net that does not fit its card); `output_scale`
    multiplies the last layer's weights, spreading the probabilities so that a small change
    of the input shows in them."""
    mx.random.seed(seed)
    net = build_model(model, classes or data.num_classes)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1,) + tuple(data.image_shape)))
    set_batchnorm(net, seed)
    if output_scale != 1.0:
        weight = [p for n, p in net.collect_params().items() if n.endswith("weight")][-1]
        weight.set_data(weight.data() * output_scale)
    os.makedirs(folder, exist_ok=True)
    net.save_parameters(os.path.join(folder, "model.params"))
    write_card(os.path.join(folder, "model.json"), model_card(model, data))
    return net


def validation_batch(data, count):
    """The first `count` validation images as training's evaluation prepares them."""
    loader = ImageLoader(data.test, SplitSampler(len(data.test)), count, train=False,
                         image_size=data.image_size, data_workers=0)
    return next(iter(loader))[0]
