"""AMP's dynamic loss scale, saved with a checkpoint and restored on resume."""
from __future__ import annotations

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
