"""``horovod.mxnet``'s API with hvdtrain underneath: ``import hvdtrain.horovod as hvd``.

Every public name of ``horovod.mxnet`` 0.28.1 is here, with its signature. Those that need
nothing more are Horovod's own (the collectives, ranks and sizes, ``Compression``,
``ProcessSet``, ``DistributedOptimizer``). hvdtrain's are:

- :func:`init`: Horovod's, and with it rank-tagged warnings on every rank, the stall
  watchdog and, at exit, a last replica check (:mod:`.session`);
- :class:`DistributedTrainer`: the bucketed exchange, a step divided by the samples every
  rank stepped with, running statistics equal on every rank, MKL-DNN layouts settled, a
  replica check every N steps (:mod:`.trainer`);
- :func:`broadcast_parameters`, :func:`broadcast_object`: hvdtrain's broadcast
  (:mod:`.broadcasts`);
- :func:`shutdown`: the exit's replica check first, then Horovod's;
- one name more, :func:`allreduce_metric`: any EvalMetric reduced over the ranks.

docs/horovod.md says what changes for a script, and what does not (its own checkpoints and
metrics).
"""
# pylint: disable=redefined-builtin,unused-import
from horovod.mxnet import (  # noqa: F401  Horovod's own
    Adasum, Average, Compression, DistributedOptimizer, Max, Min, Product, ProcessSet, Sum,
    add_process_set, allgather, allgather_object, allreduce, allreduce_, alltoall, broadcast,
    broadcast_, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
    gloo_built, gloo_enabled, grouped_allgather, grouped_allreduce, grouped_allreduce_,
    grouped_reducescatter, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, reducescatter, remove_process_set, rocm_built,
    size, start_timeline, stop_timeline)
from types import ModuleType as _ModuleType

from horovod.mxnet import shutdown as _horovod_shutdown

from .broadcasts import broadcast_object, broadcast_parameters
from .metrics import allreduce_metric
from .session import closing as _closing, start as _start
from .trainer import DistributedTrainer


def init(*args, **kwargs):
    """Horovod's ``init(comm=None, process_sets=None)``, with hvdtrain's guards around it
    (:mod:`hvdtrain.horovod.session`)."""
    _start(*_init_arguments(*args, **kwargs))


def _init_arguments(comm=None, process_sets=None):
    return comm, process_sets


def shutdown():
    """The exit's replica check and the end of the job's pulse, then Horovod's shutdown."""
    _closing()
    _horovod_shutdown()


__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not isinstance(value, _ModuleType))
