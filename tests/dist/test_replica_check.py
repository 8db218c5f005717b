"""One model on every rank, verified: GluonCV's CIFAR ResNet-20 as its own script trains it
(hybridized, NAG with weight decay, validation after each epoch, MXNet's threaded engine
and MKL-DNN) stays identical on both ranks after every step; and the replica check names
a difference made on one rank, in one line and a record, then re-syncs or stops.

Before the fix (hvdtrain/loop/engine/layouts.py) the ResNet-20 ranks differed from the
second step after the first validation in every run: MKL-DNN's change of a weight's
layout back from its inference layout was queued behind the optimizer's update on one rank
and before it on the other."""
import json
import os
import re
import sys

import mxnet as mx
import numpy as np
import pytest

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

import resnet20_program as resnet20

pytestmark = pytest.mark.dist
TAG = re.compile(r"\[1,\d+\]<std\w+>:")  # mpirun's tags, wherever they fall
RESNET = os.path.join(HERE, "resnet20_program.py")
MODELS = os.path.join(HERE, "estimator_models.py")


def records(path, event):
    return [r for r in map(json.loads, open(path)) if r["event"] == event]


def test_gluoncv_resnet20_is_one_model_on_both_ranks_after_every_step(tmp_path):
    """MXNet's default engine, as users run it: every trained array's digest after each of
    the 48 steps is the same on both ranks, and so is every array at each epoch's end,
    running statistics included; no difference was left for the replica check to find;
    and the validation figures every rank reports (GluonCV's script's ``[Accuracy(),
    Loss()]``) are MXNet's own Estimator's over the whole split in one process."""
    out = tmp_path / "run"
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MXNET_ENGINE_TYPE", "MXNET_MKLDNN_ENABLED")}
    proc = run_command(launcher("ranks", 2) + [sys.executable, RESNET, str(out),
                                               f"output_dir={out / 'outputs'}"],
                       timeout=JOB_TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    reports = [json.load(open(out / f"rank{r}.json")) for r in (0, 1)]
    steps = reports[0]["digests"]
    assert len(steps) == 48
    differ = [i for i, (a, b) in enumerate(zip(steps, reports[1]["digests"])) if a != b]
    assert not differ, f"the ranks' weights differ after steps {differ[:5]} (of 48)"
    assert reports[0]["epoch_digests"] == reports[1]["epoch_digests"]  # statistics too
    final = [dict(np.load(out / f"rank{r}.npz")) for r in (0, 1)]
    assert_same_params(*final)
    assert not records(out / "outputs" / "metrics.jsonl", "replicas")
    assert "replicas differ" not in proc.stdout
    # What every rank reports is the whole split's: MXNet's own Estimator in this process
    # scores the final weights over every validation image.
    accuracy, loss = one_process_validation(final[0])
    for report in reports:
        assert report["val_count"] == resnet20.VAL
        assert report["val"][-1]["validation accuracy"] == accuracy, (report["val"], accuracy)
        assert abs(report["val"][-1]["validation loss"] - loss) <= 1e-5 * loss


def one_process_validation(arrays):
    """(accuracy, mean loss) of GluonCV's ResNet-20 holding `arrays`, over the whole
    validation split, by MXNet's own Estimator in one process."""
    from gluoncv.model_zoo import get_model
    from mxnet import gluon
    from mxnet.gluon.contrib.estimator import Estimator as MXNetEstimator
    net = get_model("cifar_resnet20_v1", classes=10)
    net.initialize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(arrays[name]))
    metrics = [mx.metric.Accuracy(), mx.metric.Loss()]
    estimator = MXNetEstimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), val_metrics=metrics,
                               context=mx.cpu())
    estimator.logger.disabled = True
    estimator.evaluate(gluon.data.DataLoader(resnet20.validation_set(),
                                             batch_size=resnet20.BATCH))
    return (float(estimator.val_metrics[0].get()[1]), float(estimator.val_metrics[1].get()[1]))


def nudged_run(tmp_path, policy):
    """The regression example at 2 ranks, 2 epochs of 6 steps, rank 1's ``0.weight``
    nudged by 1e-3 after step 3; returns (the process, its folder)."""
    out = tmp_path / policy
    out.mkdir()
    proc = run_command(launcher("ranks", 2) + [
        sys.executable, MODELS, "regression", str(out), "nudge_at_step=3",
        f"replica_check={policy}", f"output_dir={out / 'outputs'}"], timeout=JOB_TIMEOUT)
    return proc, out


def test_a_difference_on_one_rank_is_named_recorded_and_resynced(tmp_path):
    proc, out = nudged_run(tmp_path, "resync")
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = records(out / "outputs" / "metrics.jsonl", "replicas")
    assert len(found) == 1, found  # once re-synced, the second epoch's end finds none
    assert found[0]["where"] == "the end of epoch 1 (step 6)"
    assert (found[0]["epoch"], found[0]["step"]) == (0, 6)  # counted as the epoch records
    assert found[0]["ranks"] == [1] and found[0]["action"] == "resync"
    # The nudged weight alone: its momentum follows the summed gradients (no weight decay).
    assert found[0]["arrays"] == ["0.weight"], found[0]["arrays"]
    assert 5e-4 < found[0]["max_difference"] < 2e-3
    lines = [l for l in proc.stdout.splitlines() if "replicas differ" in l]
    assert len(lines) == 1 and "[rank 0] WARNING" in lines[0], lines
    assert "on rank 1" in lines[0] and "0.weight" in lines[0]
    assert_same_params(*(dict(np.load(out / f"rank{r}.npz")) for r in (0, 1)))


def test_under_strict_a_difference_stops_every_rank_with_one_line(tmp_path):
    proc, out = nudged_run(tmp_path, "strict")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    errors = [l for l in proc.stdout.splitlines() if "error: replicas differ at the end of "
              "epoch 1 (step 6)" in l]
    assert len(errors) == 2, proc.stdout[-3000:]  # one line on each rank
    assert all("estimator_models.py: error: replicas differ" in l for l in errors), errors
    found = records(out / "outputs" / "metrics.jsonl", "replicas")
    assert len(found) == 1 and found[0]["action"] == "strict"
    assert not (out / "outputs" / "model.params").exists()
    assert not (out / "rank0.npz").exists()  # fit did not return


def test_arrays_of_another_size_on_one_rank_stop_every_rank_with_one_line(tmp_path):
    """Rank 1's Dense has one more unit than rank 0's: the digests differ, and so do the
    sizes. Every rank stops with the same line (issue 63, finding 6); before, each rank
    named the collective of rank 0's values by its own size, and the job hung."""
    program = os.path.join(HERE, "replica_sizes_program.py")
    proc = run_command(launcher("ranks", 2) + [sys.executable, program], timeout=90)
    assert proc.returncode == 1, proc.stdout[-3000:]
    lines = [TAG.sub("", l.split(":", 1)[1]) for l in proc.stdout.splitlines()
             if "error: replicas" in l]
    assert len(lines) == 2 and len(set(lines)) == 1, proc.stdout[-3000:]
    assert ("replicas differ in size at the test's check: 2 array(s) (bias, weight) on "
            "rank 1" in lines[0]), lines
