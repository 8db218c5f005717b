"""Model factory: the Gluon model zoo plus small nets for small images."""
from __future__ import annotations

from typing import Callable, Dict, List

from mxnet.gluon import nn
from mxnet.gluon.model_zoo import vision

from .config import ConfigError


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


def mlp(classes: int) -> nn.HybridBlock:
    """A two-layer perceptron over flattened pixels."""
    net = nn.HybridSequential()
    net.add(nn.Flatten(), nn.Dense(256, activation="relu"), nn.Dense(classes))
    return net


SMALL_MODELS: Dict[str, Callable[[int], nn.HybridBlock]] = {
    "simple_cnn": simple_cnn,
    "mlp": mlp,
}


def model_names() -> List[str]:
    """Every name `build_model` accepts."""
    # The zoo has no public listing; its registry is the one source that stays in step
    # with get_model.
    return sorted(SMALL_MODELS) + sorted(vision._models)  # pylint: disable=protected-access


def build_model(name: str, classes: int) -> nn.HybridBlock:
    """Build model `name` with a `classes`-way output layer (uninitialised).

    Raises
    ------
    ModelError
        If `name` is unknown; the message lists the valid names.
    """
    if name in SMALL_MODELS:
        return SMALL_MODELS[name](classes)
    if name in vision._models:  # pylint: disable=protected-access
        return vision.get_model(name, classes=classes)
    raise ModelError(f"unknown model {name!r}; choose one of: {', '.join(model_names())}")
