"""MXNet's event handlers at 2 ranks decide alike on every rank (docs/estimator.md, "Early
stopping and other decisions"): a checkpoint handler's "best" by a training metric read
inside an epoch, the batch counts of every handler when one rank's batch is empty, a
resume from a node-local folder, and MXNet's own CheckpointHandler writing on rank 0 alone.

Each scenario is one job of tests/dist/handler_program.py, shared by the tests that read
it. The references are MXNet's own Estimator and handlers in this process, at one process
with the global batch (the same samples a step: strided sampling, no shuffle), MXNet's file
readers and NumPy.
"""
import json
import os
import pickle
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon.contrib import estimator as mx_estimator

from helpers import assert_arrays_close, run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

import handler_program as program  # noqa: E402  (tests/dist is on the path)

pytestmark = pytest.mark.dist
RANKS = 2
GLOBAL = RANKS * program.BATCH


def launch(scenario, out):
    out.mkdir()
    return run_command(launcher("ranks", RANKS) + [sys.executable,
                                                   os.path.join(HERE, "handler_program.py"),
                                                   scenario, str(out)],
                       timeout=JOB_TIMEOUT)


def run_job(scenario, out):
    """Run `scenario` on RANKS ranks; every rank's report and arrays."""
    proc = launch(scenario, out)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    reports = [json.load(open(out / f"rank{r}.json")) for r in range(RANKS)]
    arrays = [dict(np.load(out / f"rank{r}.npz")) for r in range(RANKS)]
    return reports, arrays


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = tmp_path_factory.mktemp("handlers") / "checkpoints"
    reports, arrays = run_job("checkpoints", out)
    return out, reports, arrays


@pytest.fixture(scope="module")
def one_process(checkpoints, tmp_path_factory):
    """MXNet's Estimator at one process, with MXNet's CheckpointHandler and the program's
    subclass of it, as the program sets them, from rank 0's start: every batch's best
    value, the subclass's saves and the folders."""
    start = dict(np.load(checkpoints[0] / "rank0-start.npz"))
    out = tmp_path_factory.mktemp("one_process")
    net = program.make_net()
    net.initialize(mx.init.Zero())
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(start[name]))
    net.hybridize()
    metric = program.MeanLabel()
    estimator = mx_estimator.Estimator(
        net, gluon.loss.L2Loss(), train_metrics=[metric], context=mx.cpu(),
        trainer=gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": program.LR,
                                                             "momentum": 0.9}))
    keep = dict(monitor=metric, save_best=True, mode="max", batch_period=2, max_checkpoints=2)
    handlers = [mx_estimator.CheckpointHandler(str(out / "mxnet"), **keep),
                program.Keeping(str(out / "subclass"), **keep)]
    recorder = program.Recorder(handlers, metric)
    estimator.fit(gluon.data.DataLoader(program.make_data(program.TRAIN, 1, program.LABELS),
                                        batch_size=GLOBAL),
                  epochs=2, event_handlers=handlers + [recorder])
    return {"best": [b[0] for b in recorder.best], "calls": handlers[1].calls, "out": out}


def own_running_means(rank):
    """NumPy: rank `rank`'s mean label after each of its batches, reset every epoch."""
    labels = np.repeat(np.array(program.LABELS[rank], float), program.BATCH)
    steps = len(program.LABELS[rank])
    means = [labels[:program.BATCH * (k + 1)].mean() for k in range(steps)]
    return means * 2


def test_save_best_by_a_training_metric_inside_an_epoch_is_decided_alike(checkpoints,
                                                                         one_process):
    """CheckpointHandler(save_best=True, batch_period=2, monitor=a training metric): inside
    the epoch each rank's metric is its own share (alone, rank 0 would find a new best at
    every check, rank 1 at its first only, and rank 0 would save alone: a hang). Every
    handler on every rank holds MXNet's one-process best after every batch, the value over
    both ranks' samples; each rank's metric still reads its own share; the best model saved
    is MXNet's."""
    _, reports, _ = checkpoints
    want = one_process["best"]
    assert sorted(set(want)) == [-np.inf, 2.75, 5.5]  # new bests at the 1st and 3rd check
    for rank, report in enumerate(reports):
        for handler in range(3):
            assert [b[handler] for b in report["best"]] == want, (rank, handler)
        np.testing.assert_allclose(report["own"], own_running_means(rank), rtol=1e-12)
        assert report["final"] == 5.5  # the epoch's whole split at its end
    assert reports[0]["saves"] == reports[1]["saves"]
    assert reports[0]["saves"].count("model-best.params") == 3 * 2  # 3 handlers, 2 bests
    best = mx.nd.load(str(checkpoints[0] / "shared" / "model-best.params"))
    reference = mx.nd.load(str(one_process["out"] / "mxnet" / "model-best.params"))
    assert sorted(best) == sorted(reference)
    for name, value in reference.items():
        assert_arrays_close(best[name].asnumpy(), value.asnumpy(), 1e-5, what=name)


def test_mxnet_checkpoint_handler_and_a_subclass_write_on_rank_0_alone(checkpoints,
                                                                       one_process):
    """MXNet's CheckpointHandler imported from mxnet, and a program's subclass of it, each
    given a folder of its rank's own: rank 0 writes MXNet's files (the names MXNet writes at
    one process, max_checkpoints=2 kept), the last one holding the model every rank ends
    with; the other rank's folders stay empty; the subclass's own method runs, on every
    rank, as at one process."""
    out, reports, arrays = checkpoints
    for kind in ("mxnet", "subclass"):
        assert os.listdir(out / kind / "rank1") == [], kind
        assert sorted(os.listdir(out / kind / "rank0")) == \
            sorted(os.listdir(one_process["out"] / kind)), kind
        last = mx.nd.load(str(out / kind / "rank0" / "model-epoch1batch12.params"))
        for rank_arrays in arrays:
            assert sorted(last) == sorted(rank_arrays)
            for name, value in last.items():
                np.testing.assert_array_equal(value.asnumpy(), rank_arrays[name])
    assert reports[0]["subclass_calls"] == reports[1]["subclass_calls"] == one_process["calls"]
    assert_same_params(arrays[0], arrays[1])


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    return run_job("empty", tmp_path_factory.mktemp("handlers") / "empty")


def usable_per_position(rank, bad):
    """NumPy: rank `rank`'s usable samples at each position of an epoch of TRAIN samples
    (strided: rank r takes positions r, r + RANKS, ...)."""
    mine = np.arange(rank, program.TRAIN, RANKS).reshape(-1, program.BATCH)
    return [int(sum(p not in bad for p in batch)) for batch in mine]


def test_handlers_see_every_step_position_an_empty_batch_included(empty):
    """Rank 1's second batch of every epoch, and its first validation batch, hold no usable
    sample. MXNet's ValidationHandler(batch_period=3), CheckpointHandler(batch_period=2) and
    LoggingHandler(log_interval=1) and the program's counters run at every position on both
    ranks (alone, rank 1's counts would lag, and rank 0 would evaluate and save alone: a
    hang). At the empty position a handler sees a
    batch of no sample and empty pred, label and loss lists; a handler of rank 1 alone that
    asks to end the second epoch there ends it on both ranks at the same step."""
    reports, arrays = empty
    # Epoch 2 ends at rank 1's empty 2nd batch: the 3rd step begins and is not applied.
    assert [r["epochs"] for r in reports] == [[{"begin": 6, "end": 6},
                                               {"begin": 3, "end": 2}]] * RANKS
    assert reports[0]["empty"] == []
    assert reports[1]["empty"] == [{"shapes": [[0, 4], [0]], "lists": [True] * 3,
                                    "epoch": epoch, "position": 2} for epoch in (1, 2)]
    for rank, report in enumerate(reports):
        usable = usable_per_position(rank, program.BAD_TRAIN)
        assert report["logged_samples"] == sum(usable) + sum(usable[:2])
        # Evaluations after batches 3 and 6 and at both epochs' ends: 2 batches each.
        assert report["val_batches"] == 4 * 2
        assert report["val_empty"] == (4 if rank == 1 else 0)
        assert report["val_count"] == program.VAL - len(program.BAD_VAL)
        assert report["checkpoint_batches"] == 6 + 2
    assert_same_params(arrays[0], arrays[1])


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    out = tmp_path_factory.mktemp("handlers") / "resume"
    reports, arrays = run_job("resume", out)
    return out, reports, arrays


def one_process_resume(folder, out):
    """MXNet's Estimator and CheckpointHandler at one process, resuming from a copy of
    rank 0's checkpoints in `folder`: the arrays it ends with."""
    os.makedirs(out)
    for name in os.listdir(folder):
        if name.startswith((program.NEWER, program.OLDER)):
            with open(os.path.join(folder, name), "rb") as src, \
                    open(os.path.join(out, name), "wb") as dst:
                dst.write(src.read())
    net = program.make_net()
    net.initialize(mx.init.Xavier())
    estimator = mx_estimator.Estimator(
        net, gluon.loss.L2Loss(), train_metrics=[mx.metric.RMSE()], context=mx.cpu(),
        trainer=gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": program.LR,
                                                             "momentum": 0.9}))
    handler = mx_estimator.CheckpointHandler(out, resume_from_checkpoint=True)
    estimator.fit(gluon.data.DataLoader(program.make_data(program.TRAIN, 1),
                                        batch_size=GLOBAL),
                  epochs=4, event_handlers=[handler])
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def test_resume_from_checkpoint_is_rank_0s_on_every_rank(resumed, tmp_path):
    """MXNet's CheckpointHandler(resume_from_checkpoint=True) with a model_dir of each
    rank's own, rank 0's holding a newer checkpoint than rank 1's: every rank starts from
    rank 0's newest files (its weights and momentum, read here with MXNet's own readers),
    trains the epochs left after it (2 of 4), and ends with the arrays of MXNet's
    one-process resume from those files; rank 1's folder is left as it was."""
    out, reports, arrays = resumed
    newer = os.path.join(out, "node0", program.NEWER)
    weights = mx.nd.load(newer + ".params")
    with open(newer + ".states", "rb") as states_file:
        momentum, _ = pickle.loads(states_file.read())
    for rank, report in enumerate(reports):
        assert report["trained"] == [1, 11] and report["epochs"] == 2, rank
        assert report["started"]["max_epoch"] == 2, rank
        started = dict(np.load(out / f"rank{rank}-started.npz"))
        assert sorted(started) == sorted(weights)
        for name, value in weights.items():
            np.testing.assert_array_equal(started[name], value.asnumpy(), err_msg=name)
        assert sorted(report["started"]["momentum"]) == sorted(str(i) for i in momentum)
        for index, value in momentum.items():
            np.testing.assert_array_equal(np.array(report["started"]["momentum"][str(index)],
                                                   np.float32), value.asnumpy())
    assert_same_params(arrays[0], arrays[1])
    assert reports[1]["files"] == sorted(n + e for n in [program.OLDER]
                                         for e in (".params", ".states"))
    want = one_process_resume(os.path.join(out, "node0"), str(tmp_path / "one"))
    for name, value in want.items():
        assert_arrays_close(arrays[0][name], value, 1e-5, what=name)


def test_a_checkpoint_rank_0_cannot_read_stops_every_rank_in_one_line(tmp_path):
    """Rank 0's newest checkpoint has no .states file (rank 1's folder has no checkpoint):
    every rank stops at the resume with the same line and status 2, saying which file on
    rank 0 (alone, rank 0 would fail and rank 1 train from scratch)."""
    proc = launch("unreadable", tmp_path / "run")
    assert proc.returncode == 2, proc.stdout[-3000:]
    lines = [line for line in proc.stdout.splitlines() if ": error: " in line]
    line = (f"handler_program.py: error: CheckpointHandler(resume_from_checkpoint="
            f"True): Failed to load checkpoint, {tmp_path / 'run' / 'node0' / program.NEWER}"
            f".states does not exist (rank 0; every rank stopped at "
            f"checkpoint_handler.resume)")
    assert [line for line in lines if line.startswith("[1,0]")] == [
        f"[1,0]<stderr>:{line}"], lines
    # mpirun may end rank 1 once rank 0 has left, before it prints its own line.
    assert all(l == f"[1,1]<stderr>:{line}" for l in lines if l.startswith("[1,1]")), lines
    assert "Traceback" not in proc.stdout


def test_mxnets_own_handler_constructed_on_every_rank_at_once(tmp_path):
    """MXNet's own CheckpointHandler, constructed by every rank on a new shared model_dir
    right after a barrier (40 times), after the program made its Estimator: none raises.
    MXNet checks, then creates, the folder; before hvdtrain made it first, a review saw
    FileExistsError in 101 of 400 (3 of 40 without the Estimator's cure)."""
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "handler_folder_program.py")
    proc = run_command(launcher("ranks", 2) + [sys.executable, program, str(tmp_path)],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for rank in range(2):
        report = json.load(open(tmp_path / f"rank{rank}.json"))
        assert report["failures"] == 0, report
