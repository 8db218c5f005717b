"""Run a function once MXNet is imported: at once if it is, else right after its import.

``import hvdtrain`` registers the ``horovod`` KVStore with MXNet, and that needs MXNet
imported. Importing MXNet costs about 1.3 s of a core (its operator functions are generated
at import), which the processes that never train paid for nothing: the launcher
(``hvdtrain-launch``), ``hvdtrain-plot``, a command refused for its flags. So the package
imports MXNet only when the program does, and registers the store then. The hook is one
finder on ``sys.meta_path`` that answers for the name ``mxnet`` once, then removes itself; it
patches no class."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable, List

_LOCK = threading.Lock()
_PENDING: List[Callable[[], None]] = []


class _ThenLoader(importlib.abc.Loader):
    """MXNet's own loader, then the pending functions once its module is executed."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run_pending()

    def __getattr__(self, name):  # get_resource_reader, is_package, ... as MXNet's loader
        return getattr(self._loader, name)


class _MXNetFinder(importlib.abc.MetaPathFinder):
    """Finds ``mxnet`` as the other finders do, with its loader wrapped; nothing else."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "mxnet":
            return None
        _remove_finder()
        spec = importlib.util.find_spec("mxnet")
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader)
        return spec


_FINDER = _MXNetFinder()


def _remove_finder():
    with _LOCK:
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def _run_pending():
    with _LOCK:
        pending = list(_PENDING)
        _PENDING.clear()
    for function in pending:
        function()


def after_mxnet(function: Callable[[], None]) -> None:
    """Call `function` now if MXNet is imported, else once its import has finished.

    Parameters
    ----------
    function : callable
        Takes no argument; an exception it raises propagates from the ``import mxnet`` that
        triggered it, as a failure of that import would."""
    if "mxnet" in sys.modules:
        function()
        return
    with _LOCK:
        _PENDING.append(function)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
