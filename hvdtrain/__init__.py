"""hvdtrain: data-parallel training of MXNet Gluon models with Horovod ring-allreduce.

Any Gluon model trains distributed through :class:`Estimator`, MXNet's Estimator API with
every guarantee of a run (``hvdtrain.estimator`` is ``mxnet.gluon.contrib.estimator``'s
drop-in); the ``hvdtrain`` command is one client of it (image classification).

Importing the package registers the ``horovod`` KVStore with MXNet, as soon as MXNet is
imported (at once if it already is); it does not initialise Horovod (that happens when a store
is created). The names below are imported when first used, so a process that never trains
(the launcher, a command refused for its flags) does not import MXNet.
"""
import importlib

# Pillow binds its libjpeg when its C module loads: loaded before ``horovod.mxnet`` loads
# libmxnet's own libjpeg globally, its decoder stays usable (docs/data.md: ``import hvdtrain``
# first). About 0.04 s; the rest of the package waits until it is used.
from PIL import Image as _pillow_first  # noqa: F401  pylint: disable=unused-import

from .store.after_mxnet import after_mxnet

__version__ = "0.1.0"

_EXPORTS = {  # name: the module it comes from
    "ConfigError": ".config",
    "RunConfig": ".config",
    "TrainConfig": ".config",
    "Dataset": ".data.datasets",
    "BadSample": ".data.errors",
    "load_dataset": ".data.load",
    "DistContext": ".store.dist",
    "select_devices": ".store.dist",
    "BucketedTrainer": ".store.buckets",
    "HorovodKVStore": ".store.kvstore",
    "create_store": ".store.kvstore",
    "BatchLoader": ".data.loader",
    "MetricsWriter": ".report.log",
    "setup_logging": ".report.log",
    "build_model": ".models",
    "model_names": ".models",
    "SplitSampler": ".data.sampler",
    "ImageDataset": ".data.streamed",
    "ImageLoader": ".data.streamed",
    "load_images": ".data.streamed",
    "TrainState": ".state.train_state",
    "DeviceAccuracy": ".loop.engine.device_metrics",
    "DeviceLoss": ".loop.engine.device_metrics",
    "DeviceTopK": ".loop.engine.device_metrics",
    "BatchProcessor": ".estimator",
    "Estimator": ".estimator",
    "build_loaders": ".classify.build",
    "build_trainer": ".classify.build",
    "initialize": ".classify.build",
    "broadcast_parameters": ".loop.engine.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    """A public name, or a subpackage, imported on first use (PEP 562)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


def _register_store():
    importlib.import_module(".store.kvstore", __name__)


after_mxnet(_register_store)
