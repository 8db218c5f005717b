"""The processes that never train do not import MXNet (1.3 s of a core each: the launcher, a
command refused for its flags, ``--help``), and ``import hvdtrain`` still registers the
``horovod`` KVStore whichever of the two is imported first."""
import subprocess
import sys

import pytest


def run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True).stdout.split()


@pytest.mark.parametrize("module", ["hvdtrain", "hvdtrain.cli", "hvdtrain.launch.launcher",
                                    "hvdtrain.report.plot", "hvdtrain.check.preflight"])
def test_a_process_that_does_not_train_never_imports_mxnet(module):
    assert run(f"import sys, {module}; print('mxnet' in sys.modules)") == ["False"]


def test_a_refused_flag_is_answered_without_mxnet():
    out = run("import sys\n"
              "from hvdtrain.cli import main\n"
              "status = main(['--epochs', '-1'])\n"
              "print(status, 'mxnet' in sys.modules)")
    assert out == ["2", "False"]


@pytest.mark.parametrize("first", ["hvdtrain", "mxnet"])
def test_the_horovod_store_is_registered_whichever_comes_first(first):
    second = "mxnet" if first == "hvdtrain" else "hvdtrain"
    out = run(f"import {first}, {second}\n"
              "from mxnet.kvstore.base import KVStoreBase\n"
              "import hvdtrain\n"
              "print(KVStoreBase.kv_registry.get('horovod') is hvdtrain.HorovodKVStore)")
    assert out == ["True"]


def test_the_public_names_and_subpackages_resolve_on_first_use():
    out = run("import hvdtrain\n"
              "print(hvdtrain.Estimator.__name__, hvdtrain.estimator.__name__,\n"
              "      sorted(set(hvdtrain.__all__) - set(dir(hvdtrain))))\n"
              "from hvdtrain import create_store, TrainConfig\n"
              "print(create_store.__module__)")
    assert out == ["Estimator", "hvdtrain.estimator", "[]", "hvdtrain.store.kvstore"]
    with pytest.raises(subprocess.CalledProcessError):
        run("import hvdtrain; hvdtrain.no_such_name")


def test_pillow_still_decodes_after_hvdtrain_then_horovod_mxnet():
    """docs/data.md: ``import hvdtrain`` before ``horovod.mxnet`` keeps Pillow's JPEG decoder
    (loaded after libmxnet's libjpeg it fails, and OpenCV decodes instead, 15% slower)."""
    out = run("import hvdtrain, horovod.mxnet\n"
              "from hvdtrain.data.transforms import jpeg_decoder\n"
              "print(jpeg_decoder())")
    assert out == ["pillow"]
