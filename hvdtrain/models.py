"""Model factory: the Gluon model zoo plus small nets for small images."""
from __future__ import annotations

from typing import Callable, Dict, List

import mxnet as mx
from mxnet.gluon import nn
from mxnet.gluon.model_zoo import vision

from .config import SMALL_MODEL_NAMES, ZOO_MODELS, ConfigError  # ZOO_MODELS: re-exported


class ModelError(ConfigError):
    """An unknown model name; the message lists the valid ones."""


def simple_cnn(classes: int) -> nn.HybridBlock:
    """Two convolutions and two dense layers, no BatchNorm or dropout: fits 8x8 digits
    in a few epochs, and its updates are deterministic enough to compare runs exactly."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, padding=1, activation="relu"),
            nn.Conv2D(64, 3, padding=1, activation="relu"),
            nn.MaxPool2D(2),
            nn.Flatten(),
            nn.Dense(128, activation="relu"),
            nn.Dense(classes))
    return net


def bn_cnn(classes: int) -> nn.HybridBlock:
    """Two convolutions, each followed by BatchNorm, and a dense layer: the smallest model
    with running statistics (arrays no gradient reaches), as resnet18_v1 has, for tests and
    quick runs of the paths BatchNorm takes."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(32, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"),
            nn.GlobalAvgPool2D(),
            nn.Dense(classes))
    return net


def pool_cnn(classes: int) -> nn.HybridBlock:
    """Three convolution, BatchNorm and pooling stages and a dense layer: sees a whole small
    photo (32-64 pixels, e.g. the generated digit images of docs/data.md) in a few ms a
    sample on a CPU, where a model-zoo ResNet would take ten times longer."""
    net = nn.HybridSequential()
    for channels in (32, 64, 128):
        net.add(nn.Conv2D(channels, 3, padding=1, use_bias=False), nn.BatchNorm(),
                nn.Activation("relu"), nn.MaxPool2D(2))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(classes))
    return net


def mlp(classes: int) -> nn.HybridBlock:
    """A two-layer perceptron over flattened pixels."""
    net = nn.HybridSequential()
    net.add(nn.Flatten(), nn.Dense(256, activation="relu"), nn.Dense(classes))
    return net


# Keyed by config.SMALL_MODEL_NAMES (what --help lists): a name without a builder fails here.
SMALL_MODELS: Dict[str, Callable[[int], nn.HybridBlock]] = {
    name: {"simple_cnn": simple_cnn, "bn_cnn": bn_cnn, "pool_cnn": pool_cnn, "mlp": mlp}[name]
    for name in SMALL_MODEL_NAMES}


def model_names() -> List[str]:
    """Every name `build_model` accepts."""
    return sorted(SMALL_MODELS) + list(ZOO_MODELS)


def build_model(name: str, classes: int) -> nn.HybridBlock:
    """Build model `name` with a `classes`-way output layer (uninitialised), its parameters
    named as in a new process.

    Raises
    ------
    ModelError
        If `name` is unknown; the message lists the valid names.
    """
    check_model_name(name)
    # Gluon names parameters from process-wide counters (conv0_, conv1_, resnetv10_): a
    # fresh count gives the names a new process would, whatever this one built before, so
    # an exported model's parameter names match the net built to load them (--init-from).
    with mx.name.NameManager():
        if name in SMALL_MODELS:
            return SMALL_MODELS[name](classes)
        return vision.get_model(name, classes=classes)


def check_model_name(name: str) -> None:
    """Refuse a name :func:`build_model` does not know (ModelError listing the valid ones)."""
    if name not in SMALL_MODELS and name not in ZOO_MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of: {', '.join(model_names())}")
