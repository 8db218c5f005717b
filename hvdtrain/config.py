"""The training configuration: one frozen, validated dataclass.

Argument parsing lives in :mod:`hvdtrain.cli`; this module only knows what a valid
configuration is, so the library API and the command line share one set of rules.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional, Tuple

KVSTORES = ("horovod", "local", "device", "none",
            "dist_sync", "dist_device_sync", "dist_async")
DATASETS = ("cifar10", "digits", "synthetic")
OPTIMIZERS = ("sgd", "nag", "adam", "adamw", "rmsprop")
SAMPLING_MODES = ("strided", "contiguous")
LR_SCALING = ("none", "linear")
DTYPES = ("float32", "float16")
HALF_NEEDS_GPU = ("--amp and --dtype float16 need a GPU: MXNet 1.9.1's CPU kernels have no "
                  "float16 (its CPU AMP is bfloat16); train in float32 on CPUs")


class ConfigError(ValueError):
    """A configuration a user can fix; its message is one line meant for them."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides what a training run does.

    Parameters
    ----------
    batch_size : int
        Samples per device per step. With Horovod a worker drives one device, so this is
        per worker; the global batch is ``batch_size * devices per worker * num_workers``.
    lr : float
        Learning rate for the *global* batch: gradients are averaged over it.
    lr_scaling : {'none', 'linear'}
        ``linear`` multiplies `lr` by the number of workers (then `lr` is the rate for
        one worker's batch).
    sampling : {'strided', 'contiguous'}
        How the shuffled training set is split over workers. ``strided`` makes N workers
        with batch b see exactly the samples of one worker with batch N*b, step by step.
    max_steps : int or None
        Stop after this many optimizer steps in total (for smoke tests).
    grad_bucket_mb : float
        Gradients are reduced in grouped calls of at most this many MiB, last layer
        first (horovod store); 0 reduces each parameter on its own.
    stall_timeout : float
        A rank that completes no training or evaluation step for this many seconds logs
        which step it last finished and exits, so a frozen rank ends the job instead of
        hanging it (0: off). The default, 10 minutes, leaves room for what a healthy GPU
        job does between two steps: cuDNN autotuning on the first step and writing a large
        checkpoint can each take minutes.
    """

    batch_size: int = 64
    epochs: int = 5
    lr: float = 0.01
    no_cuda: bool = False
    kvstore: str = "horovod"
    dataset: str = "cifar10"
    data_dir: Optional[str] = None
    model: Optional[str] = None
    optimizer: str = "sgd"
    momentum: float = 0.9
    wd: float = 1e-4
    seed: int = 42
    max_steps: Optional[int] = None
    output_dir: Optional[str] = None
    log_interval: int = 50
    data_workers: int = 2
    sampling: str = "strided"
    lr_scaling: str = "none"
    warmup_epochs: float = 0.0
    lr_decay_epochs: Tuple[int, ...] = field(default_factory=tuple)
    lr_decay_factor: float = 0.1
    hybridize: bool = True
    fp16_allreduce: bool = False
    grad_bucket_mb: float = 25.0
    gpus: Tuple[int, ...] = field(default_factory=tuple)
    gpus_per_worker: Optional[int] = None
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    resume: Optional[str] = None
    finite_check_every: int = 10
    progress: Optional[bool] = None
    dtype: str = "float32"
    amp: bool = False
    tensorboard: Optional[str] = None
    horovod_timeline: Optional[str] = None
    stall_timeout: float = 600.0

    def __post_init__(self):
        validate(self)

    def replace(self, **changes) -> "TrainConfig":
        """Return a copy with `changes` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """A JSON-ready view, as written to metrics and checkpoints."""
        out = dataclasses.asdict(self)
        out["lr_decay_epochs"] = list(self.lr_decay_epochs)
        out["gpus"] = list(self.gpus)
        return out

    @property
    def model_name(self) -> str:
        """The model to build: `model`, or the dataset's default."""
        if self.model:
            return self.model
        return "simple_cnn" if self.dataset == "digits" else "resnet18_v1"


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _check_range(cfg, name: str, low, high, low_open: bool, high_open: bool) -> None:
    """Refuse a field (None is "not given") that is not a finite number in the range.

    argparse's float() takes ``inf``, ``nan`` and ``1e999``: none of them can train.
    """
    value = getattr(cfg, name)
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{_flag(name)} must be a finite number, got {value}")
    below = value <= low if low_open else value < low
    above = high is not None and (value >= high if high_open else value > high)
    if not (below or above):
        return
    if high is None:
        wanted = "positive" if low_open and low == 0 else f"{'>' if low_open else '>='} {low}"
    else:
        wanted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    raise ConfigError(f"{_flag(name)} must be {wanted}, got {value}")


# The range of every numeric field: (low, high, low_open, high_open); high None: no upper
# bound. The seed is bounded by what MXNet's and numpy's generators take (seed + rank).
RANGES = {
    "batch_size": (0, None, True, False),
    "epochs": (0, None, True, False),
    "lr": (0, None, True, False),
    "max_steps": (0, None, True, False),
    "gpus_per_worker": (0, None, True, False),
    "checkpoint_every": (0, None, True, False),
    "keep_checkpoints": (0, None, True, False),
    "finite_check_every": (0, None, True, False),
    "momentum": (0, 1, False, True),
    "lr_decay_factor": (0, 1, True, False),
    "wd": (0, None, False, False),
    "log_interval": (0, None, False, False),
    "data_workers": (0, None, False, False),
    "warmup_epochs": (0, None, False, False),
    "grad_bucket_mb": (0, None, False, False),
    "stall_timeout": (0, None, False, False),
    "seed": (0, 2 ** 31 - 1, False, False),
}


def _one_of(cfg, name, choices):
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(f"{_flag(name)} must be one of {', '.join(choices)}; got {value!r}")


def validate(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` naming the first invalid field of `cfg`."""
    for name, (low, high, low_open, high_open) in RANGES.items():
        _check_range(cfg, name, low, high, low_open, high_open)
    _one_of(cfg, "kvstore", KVSTORES)
    _one_of(cfg, "dataset", DATASETS)
    _one_of(cfg, "optimizer", OPTIMIZERS)
    _one_of(cfg, "sampling", SAMPLING_MODES)
    _one_of(cfg, "lr_scaling", LR_SCALING)
    _one_of(cfg, "dtype", DTYPES)
    if cfg.amp and cfg.dtype == "float16":
        raise ConfigError("--amp already runs in mixed float16/float32: drop --dtype float16")
    if cfg.no_cuda and (cfg.amp or cfg.dtype == "float16"):
        raise ConfigError(HALF_NEEDS_GPU)
    if cfg.dataset == "cifar10" and not cfg.data_dir:
        raise ConfigError("--dataset cifar10 needs --data-dir: the folder holding "
                          "data_batch_1.bin .. data_batch_5.bin and test_batch.bin")
    if cfg.resume == "auto" and not cfg.output_dir:
        raise ConfigError("--resume auto looks for checkpoints in --output-dir; give one")
    if cfg.gpus and cfg.gpus_per_worker:
        raise ConfigError("give either --gpus or --gpus-per-worker, not both")
    if cfg.data_dir and cfg.dataset != "cifar10":
        raise ConfigError(f"--data-dir is read by --dataset cifar10 only; --dataset "
                          f"{cfg.dataset} would ignore it: drop one of them")
    if cfg.no_cuda and (cfg.gpus or cfg.gpus_per_worker):
        raise ConfigError("--no-cuda trains on the CPU: drop --gpus and --gpus-per-worker, or "
                          "--no-cuda")
    if any(g < 0 for g in cfg.gpus):
        raise ConfigError(f"--gpus must be GPU ids >= 0, got {list(cfg.gpus)}")
    if cfg.kvstore == "dist_async" and (cfg.warmup_epochs or cfg.lr_decay_epochs):
        raise ConfigError("--kvstore dist_async runs the optimizer on the servers, which "
                          "never see a learning-rate schedule: drop --warmup-epochs and "
                          "--lr-decay-epochs")
    if any(e <= 0 for e in cfg.lr_decay_epochs):
        raise ConfigError("--lr-decay-epochs must be positive epoch numbers")
    if list(cfg.lr_decay_epochs) != sorted(set(cfg.lr_decay_epochs)):
        raise ConfigError("--lr-decay-epochs must be increasing")
    if cfg.horovod_timeline and cfg.kvstore != "horovod":
        raise ConfigError("--horovod-timeline records Horovod's collectives: it needs "
                          "--kvstore horovod")
