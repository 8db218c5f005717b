"""scripts/run_horovod_scripts.py under a launcher, on stand-in files of the suite's own
written in the field's style (GluonCV's and Horovod's are not part of the repository): the
import of horovod.mxnet is changed and nothing else; a ``test_*.py`` runs under pytest on
every rank; the measurement hook's dumps show the ranks' arrays (the BatchNorm statistics
that differ under horovod.mxnet are equal under hvdtrain.horovod); a folder the patches do
not fit is refused in one line."""
import os
import re
import shutil
import sys

import pytest

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, launcher

pytestmark = pytest.mark.dist
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
RUNNER = os.path.join(SCRIPTS, "run_horovod_scripts.py")
COMPARE = os.path.join(SCRIPTS, "compare_horovod_dumps.py")
MPIRUN_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")

# As Horovod's test/parallel files are written: the module imported from horovod.mxnet, the
# `mock` package of its test helpers.
FIELD_TESTS = '''
import mock
import mxnet as mx
from horovod.mxnet import allreduce, init, size


def test_allreduce_sums_over_the_ranks():
    init()
    out = allreduce(mx.nd.ones((3,)), average=False, name="field.sum")
    assert out.asnumpy().tolist() == [size()] * 3


def test_mock_is_unittests():
    assert mock.MagicMock()() is not None
'''


def run_runner(*args, ranks=2, env=None):
    prefix = launcher("ranks", ranks) if ranks else []
    proc = run_command(prefix + [sys.executable, RUNNER, *map(str, args)],
                       timeout=JOB_TIMEOUT, env=dict(os.environ, **(env or {})))
    proc.stdout = MPIRUN_TAG.sub("", proc.stdout)
    return proc


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A user's folder of fetched scripts: one training script and one test file."""
    path = tmp_path_factory.mktemp("fetched")
    shutil.copy(os.path.join(HERE, "horovod_field_program.py"), path / "train_field.py")
    shutil.copy(os.path.join(HERE, "say.py"), path / "say.py")  # the program's neighbour
    (path / "tests").mkdir()
    (path / "tests" / "test_field_ops.py").write_text(FIELD_TESTS)
    return path


@pytest.fixture(scope="module", params=["horovod.mxnet", "hvdtrain.horovod"])
def trained(request, folder, tmp_path_factory):
    """The training script at 2 ranks under one module, its arrays dumped."""
    dumps, out = tmp_path_factory.mktemp("dumps"), tmp_path_factory.mktemp("out")
    proc = run_runner("--module", request.param, "--dump", dumps, "--seed", 3,
                      folder, "train_field.py", out)
    compared = run_command([sys.executable, COMPARE, str(dumps)], timeout=120)
    return request.param, proc, compared.stdout, out


def test_the_import_is_changed_and_nothing_else(trained):
    module, proc, _, out = trained
    assert proc.returncode == 0, proc.stdout[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] train_field.py: 1 import(s) of horovod.mxnet now of {module}, " \
               f"0 patch(es)\n" in proc.stdout
        assert f"[rank {rank}] rank {rank} of 2: module {module}\n" in proc.stdout
        assert f"[rank {rank}] rank {rank} epoch 1 train " in proc.stdout
        assert (out / f"model-rank{rank}.params").is_file()


def test_the_dumps_show_whether_the_ranks_hold_one_model(trained):
    """Each rank's half of the data is drawn differently: under horovod.mxnet the running
    statistics differ after each epoch (the weights do not: they are averaged); under
    hvdtrain.horovod no array differs."""
    module, proc, report, _ = trained
    assert proc.returncode == 0, proc.stdout[-3000:]
    for epoch in (0, 1):
        stats = 2 if module == "horovod.mxnet" else 0
        assert f"epoch {epoch}: rank 0 vs 1: {stats} of 2 running statistics and 0 of 6 " \
               f"other arrays differ" in report, report
    assert re.search(r"rank 1: 12 steps, [\d.]+ steps/s", report), report


def test_a_test_file_runs_under_pytest_on_every_rank(folder):
    proc = run_runner(folder, "tests/test_field_ops.py")
    assert proc.returncode == 0, proc.stdout[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] tests/test_field_ops.py: 1 import(s) of horovod.mxnet now of " \
               f"hvdtrain.horovod, 0 patch(es)\n" in proc.stdout
        for test in ("test_allreduce_sums_over_the_ranks", "test_mock_is_unittests"):
            assert re.search(rf"\[rank {rank}\] PASSED .*test_field_ops.py::{test}\n",
                             proc.stdout), proc.stdout[-3000:]


def test_a_file_the_patches_do_not_fit_is_refused_in_one_line(tmp_path):
    """A train_ssd.py that is not GluonCV 0.10's: exit 2, one line, nothing run."""
    (tmp_path / "train_ssd.py").write_text("import horovod.mxnet as hvd\nraise SystemExit(7)\n")
    proc = run_runner(tmp_path, "train_ssd.py", ranks=0)
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        "run_horovod_scripts.py: error: train_ssd.py: expected 1 of "
        "'ctx = \\\\[mx\\\\.gpu\\\\(hvd\\\\.local_rank\\\\(\\\\)\\\\)\\\\]', found 0: not the "
        "release run_horovod_scripts.py knows (GluonCV 0.10)"], proc.stdout
    proc = run_runner(tmp_path, "train_horovod.py", ranks=0)
    assert proc.returncode == 2
    assert proc.stdout.strip() == f"run_horovod_scripts.py: error: {tmp_path} holds no " \
                                  f"train_horovod.py: fetch the scripts there first " \
                                  f"(docs/horovod-field.md)"


# The lines of GluonCV 0.10's train_horovod.py that its patches change, as they stand there.
GLUONCV_LINES = '''
import os
import horovod.mxnet as hvd


class args:
    input_size = 64


num_classes = 1000


def get_train_data():
    from autogluon.utils import pil_transforms
    return pil_transforms


def get_val_data():
    from autogluon.utils import pil_transforms
    return pil_transforms


kwargs = {'ctx': None,
          'pretrained': False,
          'classes': num_classes,
          'input_size': args.input_size}
print(hvd.__name__, num_classes, sorted(kwargs), get_train_data(), get_val_data())
'''


def test_gluoncv_train_horovod_patches(tmp_path):
    """The three patches of train_horovod.py, on its lines: autogluon optional, the class
    count from HVDFIELD_CLASSES, no input_size for the model."""
    (tmp_path / "train_horovod.py").write_text(GLUONCV_LINES)
    proc = run_runner(tmp_path, "train_horovod.py", ranks=0, env={"HVDFIELD_CLASSES": "10"})
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines() == [
        "train_horovod.py: 1 import(s) of horovod.mxnet now of hvdtrain.horovod, 3 patch(es)",
        "hvdtrain.horovod 10 ['classes', 'ctx', 'pretrained'] None None"], proc.stdout


# The lines of Horovod 0.28.1's examples/mxnet/mxnet_imagenet_resnet50.py that its patches
# change, as they stand there.
RESNET50_LINES = '''
import os
import horovod.mxnet as hvd

num_classes = 1000
num_training_samples = 1281167
if True:
    image_shape = (3, 224, 224)
print(hvd.__name__, num_classes, num_training_samples, image_shape)
'''


def test_horovod_imagenet_example_patches(tmp_path):
    """The three patches of Horovod's ImageNet example, on its lines: the class count, the
    epoch's samples and the synthetic images' size from the environment."""
    (tmp_path / "mxnet_imagenet_resnet50.py").write_text(RESNET50_LINES)
    proc = run_runner(tmp_path, "mxnet_imagenet_resnet50.py", ranks=0,
                      env={"HVDFIELD_CLASSES": "10", "HVDFIELD_SAMPLES": "128",
                           "HVDFIELD_IMAGE_SIZE": "64"})
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines() == [
        "mxnet_imagenet_resnet50.py: 1 import(s) of horovod.mxnet now of hvdtrain.horovod, "
        "3 patch(es)", "hvdtrain.horovod 10 128 (3, 64, 64)"], proc.stdout
