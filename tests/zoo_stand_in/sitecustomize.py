"""A stand-in for the Gluon model zoo's download, for documented lines with ``--pretrained``.

This machine cannot reach MXNet's download host. With ``HVDTRAIN_TEST_ZOO`` set to
``MODEL=SHA1``, MXNet's own model store (``get_model_file``) is told that MODEL's file has
checksum SHA1, so the stand-in placed in ``$MXNET_HOME/models`` under the name the store
derives from it is found and accepted there, through the store's own look-up and check,
as the real file would be after a download. Python imports this module at start-up when its
folder is on PYTHONPATH; it patches the store only once something imports it.
"""
import importlib.abc
import importlib.util
import os
import sys

STORE = "mxnet.gluon.model_zoo.model_store"


class _ZooStandIn(importlib.abc.MetaPathFinder):
    def __init__(self, model, sha1):
        self.model, self.sha1 = model, sha1

    def find_spec(self, name, path, target=None):
        if name != STORE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._model_sha1[self.model] = self.sha1  # pylint: disable=protected-access
        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("HVDTRAIN_TEST_ZOO"):
    _model, _sha1 = os.environ["HVDTRAIN_TEST_ZOO"].split("=")
    sys.meta_path.insert(0, _ZooStandIn(_model, _sha1))
