"""MXNet 1.9.1's Fit API tutorial at 2 ranks (tests/dist/fit_api_tutorial.py: its code as
written, the Estimator's import changed, MXNet's own handlers): it runs to the end, rank 0
alone writes the CheckpointHandler's files, every array is the same on every rank, and the
validation accuracy it reports is one process's accuracy of the final weights over the
whole validation split, computed here with a plain Gluon loop and NumPy."""
import json
import math
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon.model_zoo import vision

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

sys.path.insert(0, HERE)
import fit_api_tutorial as tutorial  # noqa: E402

pytestmark = pytest.mark.dist
PROGRAM = os.path.join(HERE, "fit_api_tutorial.py")
RANKS = 2
# Optimizer steps an epoch: each rank takes BATCH of every global batch of RANKS * BATCH.
STEPS = math.ceil(tutorial.TRAIN / (RANKS * tutorial.BATCH))


@pytest.fixture(scope="module")
def tutorial_run(tmp_path_factory):
    """One 2-rank run of the tutorial: (the folder it ran in, which its
    ``model_dir='./'`` names; the folder given to ranks other than 0 for their
    CheckpointHandler; every rank's report; every rank's arrays)."""
    base = tmp_path_factory.mktemp("fit_api_tutorial")
    cwd, out, others = base / "cwd", base / "out", base / "other-ranks"
    cwd.mkdir()
    out.mkdir()
    # Ranks other than 0 get a model_dir of their own: whatever a rank other than 0
    # writes as the handler's lands there, where nothing should.
    env = dict(os.environ, FIT_API_OTHER_RANKS_MODEL_DIR=str(others / "rank{rank}"))
    proc = run_command(launcher("ranks", RANKS) + ["-x", "FIT_API_OTHER_RANKS_MODEL_DIR",
                                                   sys.executable, PROGRAM, str(out)],
                       timeout=JOB_TIMEOUT, env=env, cwd=str(cwd))
    assert proc.returncode == 0, proc.stdout[-3000:]
    reports = [json.load(open(out / f"rank{r}.json")) for r in range(RANKS)]
    arrays = [dict(np.load(out / f"rank{r}.npz")) for r in range(RANKS)]
    return cwd, others, reports, arrays


def test_runs_to_the_end_on_every_rank(tutorial_run):
    _, _, reports, _ = tutorial_run
    assert [r["rank"] for r in reports] == list(range(RANKS))
    assert all(r["num_workers"] == RANKS for r in reports)


def test_rank_0_alone_writes_the_checkpoint_files(tutorial_run):
    """The folder the tutorial names (``'./'``) holds exactly MXNet's CheckpointHandler's
    files of this run, with the step counts of a rank (STEPS an epoch), each whole; the
    folder the other ranks' handlers were given holds nothing."""
    cwd, others, _, _ = tutorial_run
    saves = ["my_model-best", f"my_model-epoch0batch{STEPS}", f"my_model-epoch1batch{2 * STEPS}"]
    assert sorted(os.listdir(cwd)) == sorted(f"{p}{ext}" for p in saves
                                             for ext in (".params", ".states"))
    for prefix in saves:
        assert mx.nd.load(str(cwd / f"{prefix}.params"))  # whole: MXNet reads it
    for rank in range(1, RANKS):
        folder = others / f"rank{rank}"
        assert not folder.exists() or list(folder.rglob("*")) == [], \
            f"rank {rank} wrote {sorted(map(str, folder.rglob('*')))}"


def test_every_array_is_the_same_on_every_rank(tutorial_run):
    _, _, _, arrays = tutorial_run
    for rank in range(1, RANKS):
        assert_same_params(arrays[0], arrays[rank])  # bit-identical


def one_process_accuracy(arrays):
    """The accuracy of a resnet18_v1 holding `arrays` over the whole validation split, in
    one process: MXNet's own Gluon, the tutorial's transforms, inference mode (BatchNorm's
    running statistics), NumPy's argmax."""
    net = vision.resnet18_v1(pretrained=False, classes=10)
    net.initialize()
    size = tutorial.IMAGE_SIZE
    net(mx.nd.zeros((1, 1, size, size)))  # shapes are deferred until a first batch
    params = net._collect_params_with_prefix()  # pylint: disable=protected-access
    for name, param in params.items():
        param.set_data(mx.nd.array(arrays[name]))
    transforms = gluon.data.vision.transforms.Compose(
        [gluon.data.vision.transforms.Resize(size), gluon.data.vision.transforms.ToTensor()])
    val = tutorial.fashion_mnist_stand_in(train=False).transform_first(transforms)
    right = seen = 0
    for data, label in gluon.data.DataLoader(val, batch_size=64):
        pred = net(data).asnumpy().argmax(axis=1)
        right += int((pred == label.asnumpy()).sum())
        seen += len(pred)
    assert seen == tutorial.VAL
    return right / seen


def test_reported_validation_accuracy_is_one_process_accuracy(tutorial_run):
    """Every rank reports the whole split's accuracy of the final weights (not its own
    half's), as one process computes it."""
    _, _, reports, arrays = tutorial_run
    expected = one_process_accuracy(arrays[0])
    assert 0 < expected < 1  # the weights tell the classes apart somewhat: a real figure
    for report in reports:
        assert report["val"]["validation accuracy"] == pytest.approx(expected, abs=1e-6)
