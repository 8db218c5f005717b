"""A DataLoader built on GluonNLP's FixedBucketSampler (variable-length text, batches of
several sizes), trained by hvdtrain's Estimator on 2 ranks (batch_samplers.py), against a
plain one-process Gluon loop written here that draws the batches as docs/data.md defines
them: each epoch from a fresh sampler with numpy's and Python's generators seeded by
(seed, epoch), dealt out by rank (rank r: batches r, r + N, ...), padded to a multiple of N
with the epoch's first batches, each step the union of the N ranks' batches divided by
their total sample count. One module-scoped set of jobs serves every assertion: a run of 3
epochs, a run stopped by max_steps inside epoch 2, its resume on 2 ranks and (as an elastic
reset would) on 3."""
import json
import os
import shutil
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from helpers import assert_arrays_close, run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

import batch_samplers as programs
import bucket_steps
from bucket_steps import steps_of

pytestmark = pytest.mark.dist
PROGRAM = os.path.join(HERE, "batch_samplers.py")
STOP = 11  # max_steps of the stopped run: 8 steps an epoch on 2 ranks, so epoch 2's third


def train_ranks(ranks, out, options=()):
    """Run the program on `ranks` ranks; every rank's arrays and report, rank 0's start."""
    out.mkdir(exist_ok=True)
    proc = run_command(launcher("ranks", ranks) + [sys.executable, PROGRAM, str(out),
                                                   *options], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    arrays = [dict(np.load(out / f"rank{r}.npz")) for r in range(ranks)]
    reports = [json.load(open(out / f"rank{r}.json")) for r in range(ranks)]
    return arrays, reports, dict(np.load(out / "rank0-start.npz"))


def records(run_dir, event):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def epoch_batches(data, epoch, shuffle=True):
    """The epoch's batches as the docs define them (:func:`bucket_steps.drawn`)."""
    return bucket_steps.drawn(lambda: programs.bucket_sampler(data, shuffle), epoch,
                              programs.SEED)


def plain_loop(start, ranks_at):
    """The reference: one process, SGD without momentum, each step every rank's batch of it
    (each padded to its own longest sequence), the summed gradient divided by their total
    sample count. `ranks_at(step)` is the number of ranks at a global step. Returns (its
    arrays, every step's batches, the last epoch's training accuracy, the validation
    accuracy)."""
    train, val = programs.make_data(programs.TRAIN, 1), programs.make_data(programs.VAL, 2)
    net, batchify = programs.make_net(), programs.batchify()
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(start[name]))
        param.grad_req = "add"
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": programs.LR})
    step, steps, accuracy = 0, [], None
    for epoch in range(programs.EPOCHS):
        accuracy = mx.metric.Accuracy()
        for group in steps_of(epoch_batches(train, epoch), ranks_at, step):
            net.collect_params().zero_grad()
            for batch in group:
                x, y = batchify([train[i] for i in batch])
                with autograd.record():
                    pred = net(x)
                    loss = loss_fn(pred, y)
                loss.backward()
                accuracy.update([y], [pred])
            trainer.step(sum(len(batch) for batch in group))
            steps.append(group)
            step += 1
    scored = mx.metric.Accuracy()
    for batch in epoch_batches(val, 0, shuffle=False):
        x, y = batchify([val[i] for i in batch])
        scored.update([y], [net(x)])
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    return arrays, steps, accuracy.get()[1], scored.get()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The jobs: 'whole' (3 epochs on 2 ranks), 'stopped' (max_steps inside epoch 2),
    'resumed' (it, resumed on 2 ranks) and 'resharded' (the same stop resumed on 3)."""
    root = tmp_path_factory.mktemp("batch-samplers")
    done = {"whole": train_ranks(2, root / "whole", [f"output_dir={root / 'whole' / 'run'}"])}
    stopped = root / "stopped"
    done["stopped"] = train_ranks(2, stopped, [f"output_dir={stopped / 'run'}",
                                               f"max_steps={STOP}"])
    shutil.copytree(stopped, root / "resharded")
    for name, ranks in (("resumed", 2), ("resharded", 3)):
        done[name] = train_ranks(ranks, root / name, [f"output_dir={root / name / 'run'}",
                                                      "resume=auto"])
    done["root"] = root
    return done


def test_the_ranks_train_as_a_plain_loop_over_the_sampler_s_batches(runs):
    arrays, reports, start = runs["whole"]
    want, steps, trained, validated = plain_loop(start, lambda step: 2)
    for name, value in want.items():
        assert_arrays_close(arrays[0][name], value, 1e-5, what=name)
    assert not np.allclose(want["embed.weight"], start["embed.weight"])  # it moved
    # The steps hold batches of different sizes: a divisor of batch_size x ranks would fail.
    assert any(len({len(b) for b in group}) > 1 for group in steps)
    for rank, report in enumerate(reports):
        assert report["batch_sizes"] == [len(group[rank]) for group in steps]
        assert report["metrics"]["training accuracy"] == pytest.approx(trained, abs=1e-6)
        assert report["metrics"]["validation accuracy"] == pytest.approx(validated, abs=1e-6)
        assert report["val_count"] == programs.VAL  # each sample once, over unequal shares
        assert report["result"]["steps"] == len(steps)


def test_an_epoch_trains_every_sample_once_plus_the_padding_batches(runs):
    train = programs.make_data(programs.TRAIN, 1)
    epochs = records(runs["root"] / "whole" / "run", "epoch")
    assert len(epochs) == programs.EPOCHS
    for epoch, record in enumerate(epochs):
        batches = epoch_batches(train, epoch)
        assert sorted(i for b in batches for i in b) == list(range(programs.TRAIN))
        assert len(batches) % 2 == 1  # one batch of padding at 2 ranks: the epoch's first
        assert record["train_samples"] == programs.TRAIN + len(batches[0])
        assert record["val_samples"] == programs.VAL


def test_every_array_is_the_same_on_every_rank(runs):
    for name in ("whole", "stopped", "resumed", "resharded"):
        arrays = runs[name][0]
        for other in arrays[1:]:
            assert_same_params(arrays[0], other)


def test_a_stop_inside_an_epoch_resumes_as_the_uninterrupted_run_bit_for_bit(runs):
    stop = records(runs["root"] / "stopped" / "run", "stop")[-1]
    per_epoch = -(-len(epoch_batches(programs.make_data(programs.TRAIN, 1), 1)) // 2)
    assert stop["step"] == STOP and stop["epoch"] == 1 and STOP - per_epoch == 3
    # The checkpoint's place in the epoch: the positions of the 3 steps' 6 batches done.
    done = epoch_batches(programs.make_data(programs.TRAIN, 1), 1)[:6]
    assert stop["epoch_samples"] == sum(len(b) for b in done)
    resumed, whole = runs["resumed"][0], runs["whole"][0]
    for name, value in whole[0].items():
        np.testing.assert_array_equal(resumed[0][name], value, err_msg=name)
    assert runs["resumed"][1][0]["result"]["steps"] == runs["whole"][1][0]["result"]["steps"]


def test_a_stop_resumed_on_3_ranks_deals_the_epoch_s_rest_over_them(runs):
    arrays, reports, _ = runs["resharded"]
    start = runs["whole"][2]
    want, steps, _, validated = plain_loop(start, lambda step: 2 if step < STOP else 3)
    for name, value in want.items():
        assert_arrays_close(arrays[0][name], value, 1e-5, what=name)
    for rank, report in enumerate(reports):
        assert report["batch_sizes"] == [len(group[rank]) for group in steps[STOP:]]
        assert report["metrics"]["validation accuracy"] == pytest.approx(validated, abs=1e-6)
        assert report["val_count"] == programs.VAL


def test_a_sampler_shuffled_otherwise_on_each_rank_before_fit_is_refused_on_every_rank(
        tmp_path):
    """Each rank iterates the sampler before fit with numpy seeded by its rank (it shuffles
    in place): the ranks would draw other batches, so both stop in one line, exit 2."""
    proc = run_command(launcher("ranks", 2) + [sys.executable, PROGRAM, str(tmp_path),
                                               "iterate_unseeded=1"], timeout=JOB_TIMEOUT)
    assert proc.returncode != 0
    lines = [l for l in proc.stdout.splitlines() if "drew other batches on other ranks" in l]
    assert len(lines) == 2 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
