"""``import hvdtrain.horovod as hvd`` in a Horovod script (horovod_script.py) at 2 ranks,
against one process at the global batch (a plain Gluon Trainer, no store), and the same
script under ``horovod.mxnet`` to show what the test would catch."""
import glob
import json
import os
import re
import sys
import time

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from helpers import assert_arrays_close, run_command
from jobs import HERE, launcher

sys.path.insert(0, HERE)
import horovod_script as script  # noqa: E402

pytestmark = pytest.mark.dist
EPOCHS = 2
SCRIPT = os.path.join(HERE, "horovod_script.py")


def _run(out_dir, module, *options, env=None, timeout=240):
    os.makedirs(out_dir, exist_ok=True)
    cmd = launcher("ranks") + [sys.executable, SCRIPT, str(out_dir), module, *options]
    return run_command(cmd, timeout=timeout, env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{module: out_dir} of one 2-rank run under each module; under hvdtrain.horovod with
    two DistributedTrainers (the step's collectives of both share their names)."""
    out = {}
    # horovod.mxnet's own broadcast can crash a rank: its run starts alike everywhere.
    for module, options in (("hvdtrain.horovod", ["metric=1", "trainers=2"]),
                            ("horovod.mxnet", ["same_seed=1"])):
        folder = tmp_path_factory.mktemp(module.replace(".", "_"))
        proc = _run(folder, module, f"epochs={EPOCHS}", *options)
        assert proc.returncode == 0, proc.stdout[-3000:]
        out[module] = folder
    return out


def _arrays(folder, rank, epoch):
    return dict(np.load(os.path.join(folder, f"rank{rank}-epoch{epoch}.npz")))


def one_process(epochs):
    """One process, a plain Trainer without a store, over the same global batches: each
    rank's part forwarded on its own (BatchNorm normalises each part with its own
    statistics, as on two ranks), the gradients added, one step by the global count; the
    running statistics each part moved, averaged in NumPy after each step. Every array at
    each epoch's end."""
    mx.random.seed(script.SEED)
    with mx.name.NameManager():  # this process's name counters left as they were
        net = script.build_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    images, labels = script.data(script.SAMPLES, 1)
    stats = [p for name, p in sorted(params.items()) if "running" in name]
    net(mx.nd.array(images[:1]))  # shapes (deferred), then gradients added up
    for param in params.values():
        if param.grad_req != "null":
            param.grad_req = "add"
    epochs_out = []
    for _ in range(epochs):
        for start, stop in script.global_batches(script.SAMPLES, script.BATCH):
            before = [p.data().asnumpy() for p in stats]
            moved = []
            for rank in range(2):
                lo, hi = script.my_half(start, stop, rank, 2)
                for param, value in zip(stats, before):
                    param.set_data(mx.nd.array(value))
                with autograd.record():
                    loss = loss_fn(net(mx.nd.array(images[lo:hi])), mx.nd.array(labels[lo:hi]))
                loss.backward()
                mx.nd.waitall()
                moved.append([p.data().asnumpy().astype(np.float64) for p in stats])
            for k, param in enumerate(stats):
                param.set_data(mx.nd.array(((moved[0][k] + moved[1][k]) / 2).astype(np.float32)))
            trainer.step(stop - start)
            for param in params.values():
                if param.grad_req != "null":
                    param.zero_grad()
        epochs_out.append({n: p.data().asnumpy()
                           for n, p in net._collect_params_with_prefix().items()})  # pylint: disable=protected-access
    val_images, val_labels = script.data(script.VAL, 2)
    metric = mx.metric.Accuracy()
    metric.update([mx.nd.array(val_labels)], [net(mx.nd.array(val_images))])
    return epochs_out, metric.get()[1]


@pytest.fixture(scope="module")
def reference():
    return one_process(EPOCHS)


def test_every_array_is_the_same_on_every_rank_after_each_epoch(runs):
    for epoch in range(EPOCHS):
        a, b = (_arrays(runs["hvdtrain.horovod"], r, epoch) for r in (0, 1))
        assert sorted(a) == sorted(b)
        for name in a:
            assert np.array_equal(a[name], b[name]), f"epoch {epoch}: {name} differs"


def test_under_horovod_mxnet_the_ranks_differ(runs):
    """What the test above would catch: Horovod's trainer divides each rank's gradients by
    its own batch (the last is uneven) and never averages the running statistics (the
    ranks started from the same weights)."""
    a, b = (_arrays(runs["horovod.mxnet"], r, EPOCHS - 1) for r in (0, 1))
    differ = [name for name in a if not np.array_equal(a[name], b[name])]
    assert "1.running_mean" in differ and "0.weight" in differ, differ


def test_the_trained_model_is_one_process_at_the_global_batch(runs, reference):
    expected, accuracy = reference
    for epoch in range(EPOCHS):
        got = _arrays(runs["hvdtrain.horovod"], 0, epoch)
        for name, value in expected[epoch].items():
            assert_arrays_close(got[name], value, tol=2e-5, what=f"epoch {epoch} {name}")
    # The reduced validation metric is the whole split's, the same on every rank.
    ranks = [json.load(open(p)) for p in sorted(glob.glob(
        os.path.join(runs["hvdtrain.horovod"], "rank?.json")))]
    assert ranks[0]["val_acc"] == ranks[1]["val_acc"]
    assert ranks[0]["val_acc"][-1] == pytest.approx(accuracy)


def test_horovod_mxnet_is_not_one_process_at_the_global_batch(runs, reference):
    expected, _ = reference
    got = _arrays(runs["horovod.mxnet"], 0, EPOCHS - 1)
    worst = max(float(np.abs(got[n] - v).max()) for n, v in expected[-1].items())
    assert worst > 1e-3, worst


STALL = 8


@pytest.mark.parametrize("how", ["hang", "die", "fault"])
def test_a_frozen_or_dead_rank_ends_every_rank_within_the_stall_timeout(how, tmp_path):
    """Rank 1 stops for ever (SIGSTOP) or exits at its third step, or fails inside the
    step's own collective (store/sites.py's fault switch): rank 0, waiting in the
    exchange, ends itself with one line once nothing progressed for the timeout (a frozen
    rank), or the launcher ends it; the job never waits for ever."""
    started = time.monotonic()
    env = {"HVDTRAIN_STALL_TIMEOUT": str(STALL)}
    if how == "fault":
        env["HVDTRAIN_FAULT_AT"] = "horovod_step:1"
    proc = _run(tmp_path, "hvdtrain.horovod", "epochs=50",
                *([f"{how}=1:3"] if how != "fault" else []), env=env, timeout=STALL + 90)
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert took < STALL + 60, took
    if how == "hang":
        # The frozen rank may say so too: mpirun continues it (SIGCONT) to end it.
        lines = [line for line in proc.stdout.splitlines() if "no progress on any rank" in line]
        for rank in (0, 1):
            mine = [line for line in lines if f"[rank {rank}] ERROR" in line]
            assert len(mine) == (1 if rank == 0 else len(mine[:1])), proc.stdout[-2000:]
    if how == "fault":  # rank 1's uncaught error: its traceback, as under Horovod; rank 0,
        # whose collective Horovod shut down, names rank 1 in one line (it printed Horovod's
        # 15-line traceback from inside hvdtrain's step)
        assert "fault injected at horovod_step on rank 1" in proc.stdout, proc.stdout[-2000:]
        rank0 = [line for line in proc.stdout.splitlines() if line.startswith("[1,0]")]
        assert not any("Traceback" in line for line in rank0), proc.stdout[-3000:]
        # rank 1 named when the job's pulse made a round after rank 1 said it ended (as a
        # rule; a loaded host may miss it: "another rank")
        errors = [line for line in rank0 if "error" in line.lower()]
        assert len(errors) == 1 and re.fullmatch(
            r"\[1,0\]<stderr>:horovod_script\.py: error: rank 0: (rank 1|another rank) has "
            r"failed or left the job \(its own output says why\); Horovod has been shut down, "
            r"so this rank stops too", errors[0]), proc.stdout[-3000:]
    else:
        assert "Traceback" not in proc.stdout, proc.stdout[-2000:]


def test_a_collective_one_rank_makes_between_clipped_steps_ends_every_rank(tmp_path):
    """allreduce_grads(), clipping, update() (Horovod's idiom); rank 0 alone reduces a
    metric at step 3: rank 1 waits in its next exchange, inside hvdtrain's call, and both
    ranks end with their line within the timeout (it waited for ever when the exchange's
    wait fell in the script's clipping)."""
    started = time.monotonic()
    proc = _run(tmp_path, "hvdtrain.horovod", "epochs=50", "clip=1", "alone=0:3",
                env={"HVDTRAIN_STALL_TIMEOUT": str(STALL)}, timeout=STALL + 90)
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert took < STALL + 60, took
    for rank in (0, 1):
        assert f"[rank {rank}] ERROR rank {rank}: no progress on any rank" in proc.stdout, \
            proc.stdout[-2000:]


@pytest.mark.parametrize("policy", ["resync", "strict"])
def test_a_replica_that_drifts_is_named_then_resynced_or_stops_the_job(policy, tmp_path):
    """Rank 1 moves a weight of its own after its second step; the check every 3 steps
    names it: resync gives every rank rank 0's values and training goes on (every array
    equal at the end), strict ends every rank, one line each, exit 1."""
    proc = _run(tmp_path, "hvdtrain.horovod", "epochs=1", "nudge=1:2",
                env={"HVDTRAIN_REPLICA_CHECK": policy, "HVDTRAIN_REPLICA_CHECK_EVERY": "3"})
    lines = [line for line in proc.stdout.splitlines() if "replicas differ at step 3" in line]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    if policy == "resync":
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert len(lines) == 1 and "conv0_weight" in lines[0], proc.stdout[-3000:]
        a, b = (_arrays(tmp_path, r, 0) for r in (0, 1))
        assert all(np.array_equal(a[name], b[name]) for name in a)
    else:
        assert proc.returncode != 0
        assert len(lines) == 2 and all("error" in line for line in lines), proc.stdout[-3000:]


def test_a_symbol_blocks_statistics_are_the_same_on_every_rank(tmp_path):
    """A SymbolBlock's BatchNorm (its statistics are auxiliary states the trainer cannot tell
    from frozen parameters until the forward pass moves them): equal on both ranks after
    each epoch, as BatchNorm's own."""
    proc = _run(tmp_path, "hvdtrain.horovod", "epochs=2", "symbol=1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    for epoch in range(2):
        a, b = (_arrays(tmp_path, r, epoch) for r in (0, 1))
        assert any("moving_mean" in name for name in a), sorted(a)
        differ = [name for name in a if not np.array_equal(a[name], b[name])]
        assert not differ, f"epoch {epoch}: {differ}"
