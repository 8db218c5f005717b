"""hvdtrain: data-parallel training of MXNet Gluon models with Horovod ring-allreduce.

Any Gluon model trains distributed through :class:`Estimator`, MXNet's Estimator API with
every guarantee of a run (``hvdtrain.estimator`` is ``mxnet.gluon.contrib.estimator``'s
drop-in); the ``hvdtrain`` command is one client of it (image classification).

Importing the package registers the ``horovod`` KVStore with MXNet; it does not initialise
Horovod (that happens when a store is created).
"""
from .config import ConfigError, RunConfig, TrainConfig
from .data.datasets import Dataset
from .data.errors import BadSample
from .data.load import load_dataset
from .store.dist import DistContext, select_devices
from .store.buckets import BucketedTrainer
from .store.kvstore import HorovodKVStore, create_store
from .data.loader import BatchLoader
from .report.log import MetricsWriter, setup_logging
from .models import build_model, model_names
from .data.sampler import SplitSampler
from .data.streamed import ImageDataset, ImageLoader, load_images
from .state.train_state import TrainState
from .loop.engine.device_metrics import DeviceAccuracy, DeviceLoss, DeviceTopK
from .estimator import BatchProcessor, Estimator
from .classify.build import build_loaders, build_trainer, initialize
from .loop.engine.trainer import broadcast_parameters

__version__ = "0.1.0"

__all__ = [
    "BadSample", "BatchLoader", "BatchProcessor", "BucketedTrainer", "ConfigError",
    "Dataset", "DeviceAccuracy", "DeviceLoss", "DeviceTopK", "DistContext", "Estimator",
    "HorovodKVStore", "ImageDataset", "ImageLoader", "load_images", "MetricsWriter",
    "RunConfig", "SplitSampler", "TrainConfig", "TrainState", "build_loaders",
    "broadcast_parameters", "build_model", "build_trainer", "create_store", "initialize",
    "load_dataset", "model_names", "select_devices", "setup_logging",
]
