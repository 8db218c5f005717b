"""hvdtrain: data-parallel training of MXNet Gluon models with Horovod ring-allreduce.

Importing the package registers the ``horovod`` KVStore with MXNet; it does not initialise
Horovod (that happens when a store is created).
"""
from .config import ConfigError, TrainConfig
from .data import Dataset, load_dataset
from .dist import DistContext, select_devices
from .evaluate import EvalResult, evaluate
from .exchange import BucketedTrainer
from .kvstore import HorovodKVStore, create_store
from .loader import BatchLoader
from .log import MetricsWriter, setup_logging
from .models import build_model, model_names
from .sampler import SplitSampler
from .epoch import TrainState
from .train import (Outputs, broadcast_parameters, build_loaders, build_trainer, fit,
                    initialize)

__version__ = "0.1.0"

__all__ = [
    "BatchLoader", "BucketedTrainer", "ConfigError", "Dataset", "DistContext", "EvalResult", "HorovodKVStore",
    "MetricsWriter", "Outputs", "SplitSampler", "TrainConfig", "TrainState", "build_loaders",
    "broadcast_parameters", "build_model", "build_trainer", "create_store", "evaluate", "fit", "initialize",
    "load_dataset", "model_names", "select_devices", "setup_logging",
]
