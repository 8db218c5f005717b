"""Float16 training on GPUs: pure float16 (``--dtype float16``) or MXNet AMP (``--amp``).

Neither runs on CPUs (MXNet 1.9.1 has no float16 CPU kernels), so both are refused there
before any work starts. Only a GPU host can show these paths run; CI checks the refusals.
"""
from __future__ import annotations

from mxnet import autograd

from .config import HALF_NEEDS_GPU, ConfigError, TrainConfig


def check_devices(cfg: TrainConfig, devices) -> None:
    """Refuse half precision on CPU devices."""
    if (cfg.amp or cfg.dtype == "float16") and any(d.device_type == "cpu" for d in devices):
        raise ConfigError(HALF_NEEDS_GPU)


def init_amp(cfg: TrainConfig) -> None:
    """Turn on MXNet AMP; it patches operators, so it must run before the model is built."""
    if cfg.amp:
        from mxnet.contrib import amp  # pylint: disable=import-outside-toplevel
        amp.init()


def cast(net, cfg: TrainConfig) -> None:
    """Cast the model's parameters for ``--dtype float16`` (before the Trainer is built)."""
    if cfg.dtype == "float16":
        net.cast("float16")


def attach_amp(trainer, cfg: TrainConfig) -> None:
    """Give `trainer` AMP's dynamic loss scaler."""
    if cfg.amp:
        from mxnet.contrib import amp  # pylint: disable=import-outside-toplevel
        amp.init_trainer(trainer)


def optimizer_options(cfg: TrainConfig) -> dict:
    """Float16 weights keep a float32 master copy in the optimizer."""
    return {"multi_precision": True} if cfg.dtype == "float16" else {}


def backward(losses, trainer, use_amp: bool) -> None:
    """Backward pass, through AMP's dynamic loss scaling when it is on."""
    if use_amp:
        from mxnet.contrib import amp  # pylint: disable=import-outside-toplevel
        with amp.scale_loss(losses, trainer) as scaled:
            autograd.backward(scaled)
    else:
        autograd.backward(losses)


def input_dtype(cfg: TrainConfig) -> str:
    """The dtype batches are fed in: the model's."""
    return cfg.dtype


# AMP's LossScaler keeps its state in private attributes (MXNet 1.9.1,
# mxnet/contrib/amp/loss_scaler.py); these two functions are the only code that touches them.
_SCALER_FIELDS = ("_loss_scale", "_next_loss_scale", "_unskipped")


def loss_scale_state(trainer) -> dict:
    """AMP's dynamic loss scale, for a checkpoint (empty without AMP).

    The optimizer state file does not hold it, and a resumed run starting again from 2**16
    would first spend steps overflowing and halving back down."""
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    if scaler is None:
        return {}
    return {"amp_loss_scaler": {name.lstrip("_"): getattr(scaler, name)
                                for name in _SCALER_FIELDS}}


def restore_loss_scale(trainer, meta: dict) -> None:
    """Put the loss scale saved by :func:`loss_scale_state` back into `trainer`'s scaler."""
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    saved = meta.get("amp_loss_scaler")
    if scaler is None or not saved:
        return
    for name in _SCALER_FIELDS:
        if name.lstrip("_") in saved:
            setattr(scaler, name, type(getattr(scaler, name))(saved[name.lstrip("_")]))
