"""``hvd.broadcast_parameters`` and ``hvd.broadcast_object`` through hvdtrain's broadcast.

Horovod's own go through its MXNet broadcast, which can crash the process
(:mod:`hvdtrain.store.broadcast`); these send the root's values by a sum-allreduce. A
parameter whose shape waits for the first forward pass (Gluon's deferred initialisation)
is sent right after Gluon initialises it there, as Horovod does, by the same sum; a
parameter an inference pass left in MKL-DNN's layout is given the default layout first
(Horovod's broadcast fails on it).
"""
from __future__ import annotations

import mxnet as mx
from horovod.mxnet import functions as horovod_functions

from ..store.broadcast import ROOT_RANK, broadcast_, broadcast_object as broadcast_object_
from ..store.gluon_internals import after_deferred_init, shape_deferred, to_default_layout
from . import session as sessions

OBJECT_NAME = "hvdtrain.horovod.object"


def _hvd():
    import horovod.mxnet as hvd  # pylint: disable=import-outside-toplevel
    return hvd


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Send `params` (a dict or ParameterDict: of Parameters or NDArrays) from `root_rank`
    to every rank, in place; parameters not initialised yet are sent when they are."""
    try:
        from mxnet.gluon.parameter import ParameterDict  # pylint: disable=import-outside-toplevel
        valid = (dict, ParameterDict)
    except ImportError:
        valid = (dict,)
    if not isinstance(params, valid):
        raise ValueError(f"invalid params of type: {type(params)}")
    if not (prefix is None or isinstance(prefix, str)):
        raise ValueError(f"prefix must be a str, not {type(prefix).__name__}")
    hvd = _hvd()
    if hvd.size() == 1:
        return
    session = sessions.current()
    prefix = prefix or ""
    now = []
    for name, value in sorted(params.items()):
        key = f"broadcast.{prefix}{name}"
        if not isinstance(value, mx.gluon.Parameter):
            now.append((key, [value]))
        elif shape_deferred(value):
            after_deferred_init(value, _sender(hvd, session, root_rank, key))
        else:
            now.append((key, value.list_data()))
    with session.calling("broadcast_parameters"):
        mx.nd.waitall()
        to_default_layout([array for _, arrays in now for array in arrays])
        for key, arrays in now:
            broadcast_(hvd, arrays[0], key, root_rank=root_rank)
            for other in arrays[1:]:
                arrays[0].copyto(other)
        mx.nd.waitall()


def _sender(hvd, session, root_rank, key):
    def send(param):
        with session.calling("broadcast_parameters (deferred)"):
            arrays = param.list_data()
            broadcast_(hvd, arrays[0], key, root_rank=root_rank)
            for other in arrays[1:]:
                arrays[0].copyto(other)
    return send


def broadcast_object(obj, root_rank=0, name=None):
    """`root_rank`'s `obj` on every rank (pickled; Horovod's own, which uses cloudpickle,
    for another root). Its collectives are named by `name`, never by the object's type,
    which may differ between the ranks (the others often pass None)."""
    hvd = _hvd()
    session = sessions.current()
    with session.calling("broadcast_object"):
        if root_rank != ROOT_RANK:
            return horovod_functions.broadcast_object(obj, root_rank,
                                                      name or OBJECT_NAME)
        return broadcast_object_(hvd, obj, f"{OBJECT_NAME}.{name}" if name else OBJECT_NAME)
