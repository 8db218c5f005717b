"""hvdtrain: data-parallel training of MXNet Gluon models with Horovod ring-allreduce.

Importing the package registers the ``horovod`` KVStore with MXNet; it does not initialise
Horovod (that happens when a store is created).
"""
from .config import ConfigError, TrainConfig
from .data.datasets import Dataset
from .data.load import load_dataset
from .store.dist import DistContext, select_devices
from .loop.engine.evaluate import EvalResult, evaluate
from .store.buckets import BucketedTrainer
from .store.kvstore import HorovodKVStore, create_store
from .data.loader import BatchLoader
from .report.log import MetricsWriter, setup_logging
from .models import build_model, model_names
from .data.sampler import SplitSampler
from .data.streamed import ImageDataset, ImageLoader, load_images
from .state.train_state import TrainState
from .loop.engine.build import broadcast_parameters, build_loaders, build_trainer, initialize
from .loop.run.fit import Outputs, fit

__version__ = "0.1.0"

__all__ = [
    "BatchLoader", "BucketedTrainer", "ConfigError", "Dataset", "DistContext", "EvalResult", "HorovodKVStore",
    "ImageDataset", "ImageLoader", "load_images",
    "MetricsWriter", "Outputs", "SplitSampler", "TrainConfig", "TrainState", "build_loaders",
    "broadcast_parameters", "build_model", "build_trainer", "create_store", "evaluate", "fit", "initialize",
    "load_dataset", "model_names", "select_devices", "setup_logging",
]
