"""Three models of a user's own, trained by hvdtrain's Estimator on 2 and 3 ranks as MXNet
Estimator code trains them (examples/regression.py, sequence.py, two_inputs.py), against a
plain one-process Gluon loop written here: the weights it ends with (to 1e-5: the ranks sum
their partial gradients in another order), the metrics every rank reports (the whole
validation split's, and the last epoch's training figures), every array identical across
ranks."""
import json
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from helpers import assert_arrays_close, run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import estimator_models as programs  # noqa: E402
import two_inputs  # noqa: E402

pytestmark = pytest.mark.dist
PROGRAM = os.path.join(HERE, "estimator_models.py")
SEED = 42  # RunConfig's default seed: the shuffle's, with the epoch
# Optimizer steps an epoch takes at 2 ranks: TRAIN samples, BATCH a rank and step.
TRAIN_STEPS_PER_EPOCH = {2: -(-programs.TRAIN // (2 * programs.BATCH))}


def train_ranks(model, ranks, out, options=()):
    """Run the program on `ranks` ranks; every rank's arrays and report, and rank 0's start."""
    out.mkdir(exist_ok=True)
    proc = run_command(launcher("ranks", ranks) + [sys.executable, PROGRAM, model,
                                                        str(out), *options],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    arrays = [dict(np.load(out / f"rank{r}.npz")) for r in range(ranks)]
    reports = [json.load(open(out / f"rank{r}.json")) for r in range(ranks)]
    return arrays, reports, dict(np.load(out / "rank0-start.npz")), proc.stdout


def inputs_of(model, data, index):
    """(the net's inputs, the labels, the per-sample weights or None) of samples `index`."""
    if model == "two_inputs":
        batch = two_inputs.stack([data[i] for i in index])
        return (batch["user"], batch["item"]), batch["rating"], batch["weight"].reshape((-1, 1))
    x = mx.nd.array(np.stack([data[i][0] for i in index]))
    y = mx.nd.array(np.array([data[i][1] for i in index]))
    return (x,), y, None


def figures(model, preds, labels):
    """The metrics a plain loop computes over all its predictions at once (per element)."""
    pred, label = np.concatenate(preds), np.concatenate(labels)
    if model == "sequence":
        return {"accuracy": float((pred.argmax(1) == label).mean())}
    err = pred.reshape(-1) - label.reshape(-1)
    if model == "regression":
        return {"rmse": float(np.sqrt((err ** 2).mean()))}
    return {"mae": float(np.abs(err).mean()), "within 0.5": float((np.abs(err) < 0.5).mean())}


def plain_loop(model, start, global_batch):
    """The reference: one process, the whole global batch a step, the epoch's order as the
    docs define it (shuffled: numpy's permutation seeded by (seed, epoch); else in order).
    Returns (its arrays, its last epoch's training metrics, its validation metrics)."""
    net, loss_fn, _, _, train, val, shuffle, batchify = programs.parts(model)
    net.initialize(mx.init.Zero())
    net(*programs.first_batch(model, train, batchify))
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(start[name]))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": programs.LR,
                                                          "momentum": 0.9})
    for epoch in range(programs.EPOCHS):
        order = (np.random.default_rng([SEED, epoch]).permutation(len(train)) if shuffle
                 else np.arange(len(train)))
        preds, labels = [], []
        for first in range(0, len(train), global_batch):
            xs, y, weight = inputs_of(model, train, order[first:first + global_batch])
            with autograd.record():
                pred = net(*xs)
                loss = loss_fn(pred, y) if weight is None else loss_fn(pred, y, weight)
            loss.backward()
            preds.append(pred.asnumpy())
            labels.append(y.asnumpy())
            trainer.step(len(y))
        trained = figures(model, preds, labels)
    xs, y, _ = inputs_of(model, val, np.arange(len(val)))
    validated = figures(model, [net(*xs).asnumpy()], [y.asnumpy()])
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    return arrays, trained, validated


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("model", ["regression", "sequence", "two_inputs"])
def test_a_users_model_trains_as_a_plain_loop_over_the_whole_data(model, ranks, tmp_path):
    arrays, reports, start, log = train_ranks(model, ranks, tmp_path / "run")
    for other in arrays[1:]:
        assert_same_params(arrays[0], other)
    want, trained, validated = plain_loop(model, start, ranks * programs.BATCH)
    for name, value in want.items():
        assert_arrays_close(arrays[0][name], value, 1e-5, what=name)
    assert not np.allclose(want[sorted(want)[0]], start[sorted(want)[0]])  # it moved
    for report in reports:
        assert report["val_count"] == programs.VAL and report["num_workers"] == ranks
        for name, value in trained.items():
            assert report["metrics"][f"training {name}"] == pytest.approx(value, abs=1e-5)
        for name, value in validated.items():
            assert report["metrics"][f"validation {name}"] == pytest.approx(value, abs=1e-5)
    assert reports[0]["metrics"] == reports[-1]["metrics"]
    assert "Traceback" not in log


def test_the_run_options_keep_every_array_identical_with_a_rank_whose_first_step_is_empty(
        tmp_path):
    """The regression model with accumulation, PowerSGD from the first step, the moving
    average every step and clipping (some steps clipped, some not), on 3 ranks; the last
    rank's whole first step is samples its dataset cannot read (it runs no pass in it).
    Every array, the average's included, is the same on every rank, and every rank reports
    the same figures."""
    out = tmp_path / "run"
    arrays, reports, start, log = train_ranks(
        "regression", 3, out,
        ["accumulate=2", "compression=powersgd", "powersgd_start_step=0", "powersgd_rank=2",
         "ema=0.9", "ema_every=1", "clip_grad_norm=0.7", "unusable_first_step=1",
         "max_bad_samples=50%", "epochs=3", f"output_dir={out / 'outputs'}"])
    epochs = [json.loads(l) for l in (out / "outputs" / "metrics.jsonl").read_text()
              .splitlines() if '"epoch"' in l and '"event": "epoch"' in l]
    # Some steps clipped and some not: clipping every step would cancel a wrong divisor.
    assert 0 < sum(r["clipped_steps"] for r in epochs) < reports[0]["result"]["steps"]
    assert epochs[0]["skipped_train_samples"] == 16  # the last rank's first step, whole
    assert any(name.startswith("ema:") for name in arrays[0])
    for other in arrays[1:]:
        assert_same_params(arrays[0], other)
    assert reports[0]["metrics"] == reports[1]["metrics"] == reports[2]["metrics"]
    assert not np.allclose(arrays[0]["0.weight"], start["0.weight"])  # it trained
    assert "made unusable by the test" in log and "Traceback" not in log


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_sigterm_mid_epoch_exits_75_and_the_resume_ends_as_an_uninterrupted_run(
        dropout, tmp_path):
    """The regression model on 2 ranks with an output folder (and with Dropout(0.1), whose
    masks come from MXNet's generator): the last rank is sent SIGTERM after step 8 of 18
    (in epoch 2 of 3), every rank stops with exit 75 and the stop's checkpoint; run again
    with resume='auto', it ends with the arrays of a run never stopped, bit for bit."""
    out = tmp_path / "stopped"
    out.mkdir()
    run = ["output_dir=" + str(out / "run"), "epochs=3", f"dropout={dropout}"]
    proc = run_command(launcher("ranks", 2) + [sys.executable, PROGRAM, "regression",
                                                    str(out), *run, "sigterm_at_step=8"],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 75, proc.stdout[-3000:]
    line = [l for l in proc.stdout.splitlines() if "hvdtrain: stopped at step" in l]
    assert len(line) == 1 and "resume='auto'" in line[0], proc.stdout[-3000:]
    records = [json.loads(l) for l in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    stop = records[-1]
    assert stop["event"] == "stop" and 9 <= stop["step"] < 12, stop  # inside epoch 2
    resumed_arrays, _, _, _ = train_ranks("regression", 2, out, run + ["resume=auto"])
    whole, _, _, _ = train_ranks("regression", 2, tmp_path / "whole",
                                 ["epochs=3", f"dropout={dropout}"])
    for name, value in whole[0].items():
        np.testing.assert_array_equal(resumed_arrays[0][name], value, err_msg=name)


def test_a_handler_of_one_rank_that_ends_training_ends_it_on_every_rank(tmp_path):
    """An epoch handler of the last rank alone returns True after epoch 1 of 3 (an early
    stopping rule fed other figures would): every rank ends there, after the same steps,
    and none waits for the others in a collective."""
    arrays, reports, _, log = train_ranks("sequence", 2, tmp_path / "run",
                                          ["epochs=3", "stop_after_epoch=1"])
    per_epoch = TRAIN_STEPS_PER_EPOCH[2]
    assert [r["result"]["steps"] for r in reports] == [per_epoch, per_epoch]
    assert_same_params(arrays[0], arrays[1])
