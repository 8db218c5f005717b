"""Float16 training on GPUs: pure float16 (``--dtype float16``) or MXNet AMP (``--amp``).

Neither runs on CPUs (MXNet 1.9.1 has no float16 CPU kernels), so both are refused there
before any work starts. Only a GPU host can show these paths run; CI checks the refusals.
"""
from __future__ import annotations

from dataclasses import dataclass

from mxnet import autograd

from ...config import HALF_NEEDS_GPU, ConfigError, TrainConfig


@dataclass(frozen=True)
class Precision:
    """How a run computes: the model's dtype and whether MXNet AMP is on.

    Built once from the configuration (:meth:`of`); the job, the trainer builder and the
    training loop consult it instead of reading the flags each on their own.
    """

    dtype: str = "float32"
    amp: bool = False

    @classmethod
    def of(cls, cfg: TrainConfig) -> "Precision":
        return cls(cfg.dtype, cfg.amp)

    @property
    def half(self) -> bool:
        """Whether any float16 compute is asked for."""
        return self.amp or self.dtype == "float16"

    def check_devices(self, devices) -> None:
        """Refuse half precision on CPU devices."""
        if self.half and any(d.device_type == "cpu" for d in devices):
            raise ConfigError(HALF_NEEDS_GPU)

    def before_model(self) -> None:
        """Turn on MXNet AMP; it patches operators, so it must run before the model is built."""
        if self.amp:
            from mxnet.contrib import amp  # pylint: disable=import-outside-toplevel
            amp.init()

    def prepare_model(self, net) -> None:
        """Cast the model's parameters for ``--dtype float16`` (before the Trainer is built)."""
        if self.dtype == "float16":
            net.cast("float16")

    def optimizer_options(self) -> dict:
        """Float16 weights keep a float32 master copy in the optimizer."""
        return {"multi_precision": True} if self.dtype == "float16" else {}

    def prepare_trainer(self, trainer) -> None:
        """Give `trainer` AMP's dynamic loss scaler."""
        if self.amp:
            from mxnet.contrib import amp  # pylint: disable=import-outside-toplevel
            amp.init_trainer(trainer)

    def backward(self, losses, trainer) -> None:
        """Backward pass, through AMP's dynamic loss scaling when it is on."""
        if self.amp:
            from mxnet.contrib import amp  # pylint: disable=import-outside-toplevel
            # The scaling multiplies the losses: recorded, or backward finds them outside
            # the graph ("Cannot differentiate node"), as MXNet's AMP examples record it.
            with autograd.record(), amp.scale_loss(losses, trainer) as scaled:
                autograd.backward(scaled)
        else:
            autograd.backward(losses)

    @property
    def input_dtype(self) -> str:
        """The dtype batches are fed in: the model's (cast on the device)."""
        return self.dtype
