"""The training recipe on two Horovod ranks: clipping against a plain one-process Gluon loop
on the global batch, and every option at once keeping the replicas identical and resuming
exactly."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain.data.load import load_dataset
from hvdtrain.models import build_model
from jobs import DIGITS, assert_same_model, assert_same_params, launcher, run_ranks

pytestmark = pytest.mark.dist

SEED, LR, MAX_NORM, STEPS = 42, 0.1, 1.0, 8
CLIPPED = DIGITS + ["--model", "mlp", "--sampling", "strided", "--lr", str(LR), "--seed",
                    str(SEED), "--clip-grad-norm", str(MAX_NORM), "--max-steps", str(STEPS)]


def plain_clipped(initial, global_batch, wire=None):
    """The reference, written from the documented semantics with a plain ``gluon.Trainer``
    (no store): with --sampling strided, step k of 2 ranks holds positions
    ``k*G .. (k+1)*G - 1`` of the epoch's shuffle ``default_rng([seed, epoch])``, rank r the
    ones of parity r. Its gradient is one backward pass over the whole global batch or, with
    `wire` (float16 on the wire), each rank's part's gradient cast to `wire` and the two
    summed in it; then averaged, its L2 norm taken in float64, scaled by
    ``min(1, MAX / (norm + 1e-6))`` and applied. Returns the trained arrays and the norms."""
    data = load_dataset("digits")
    net = build_model("mlp", data.num_classes)
    net.initialize(ctx=mx.cpu())
    net(mx.nd.zeros((1,) + data.train_x.shape[1:]))
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(initial[name]))
    params = list(net.collect_params().values())
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": LR, "momentum": 0.9, "wd": 1e-4}, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    order = np.random.default_rng([SEED, 0]).permutation(len(data.train_y))

    def gradients(index):
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(data.train_x[index])),
                           mx.nd.array(data.train_y[index]))
        loss.backward()
        return [p.grad().asnumpy() for p in params]

    norms = []
    for step in range(STEPS):
        index = order[step * global_batch:(step + 1) * global_batch]
        if wire is None:
            summed = [g.astype(np.float64) for g in gradients(index)]
        else:
            parts = [[g.astype(wire) for g in gradients(index[r::2])] for r in (0, 1)]
            summed = [(a + b).astype(np.float64) for a, b in zip(*parts)]
        norm = float(np.sqrt(sum(((g / len(index)) ** 2).sum() for g in summed)))
        factor = min(1.0, MAX_NORM / (norm + 1e-6))
        for param, grad in zip(params, summed):
            param.grad()[:] = mx.nd.array((grad * factor).astype(np.float32))
        trainer.step(len(index))
        norms.append(norm)
    return {n: p.data().asnumpy()
            for n, p in net._collect_params_with_prefix().items()}, norms  # pylint: disable=protected-access


@pytest.mark.parametrize("extra,global_batch,wire,tol", [
    ([], 64, None, 1e-5),
    (["--fp16-allreduce"], 64, np.float16, 1e-4),
    (["--accumulate", "2", "--batch-size", "16"], 64, None, 1e-5),
], ids=["buckets", "fp16-wire", "accumulate-2"])
def test_two_ranks_clip_as_a_plain_loop_on_the_global_batch(tmp_path, extra, global_batch,
                                                            wire, tol):
    flags = CLIPPED + ["--batch-size", "32"] + extra + ["--output-dir", str(tmp_path / "out")]
    results, params, _ = run_ranks(launcher("ranks"), tmp_path, flags,
                                   env={"HVDTRAIN_DUMP_START": "1"})
    assert [r["steps"] for r in results] == [STEPS, STEPS]
    assert results[0]["grad_buckets"] >= 1  # the exchange went through the zero-copy buckets
    assert_same_params(params[0], params[1])
    initial = dict(np.load(tmp_path / "rank0-start.npz"))
    want, norms = plain_clipped(initial, global_batch, wire)
    assert sum(n > MAX_NORM for n in norms) >= STEPS // 2  # the clip acted
    assert_same_params(params[0], want, tol=tol)
    stop = [json.loads(line) for line in
            (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()][-2]
    assert stop["event"] == "stop"
    assert stop["grad_norm_max"] == pytest.approx(max(norms), rel=1e-3)
    assert stop["clipped_steps"] == sum(n > MAX_NORM for n in norms)


# Every option of the recipe at once, with float16 on the wire and label smoothing, on a
# model-zoo ResNet (--last-gamma needs one): 2 epochs of 3 steps at 2 x 256 (a step of
# ResNet-18 on 8x8 digits costs about what its 11M parameters cost: few, large steps), the
# first mixing, the second not.
EVERYTHING = DIGITS + ["--model", "resnet18_v1", "--batch-size", "256", "--lr", "0.1",
                       "--epochs", "2", "--mixup", "0.2", "--cutmix", "1.0",
                       "--mix-off-epoch", "1", "--label-smoothing", "0.1", "--no-wd",
                       "--last-gamma", "--ema", "0.9", "--ema-every", "2",
                       "--clip-grad-norm", "1.0", "--fp16-allreduce"]


def saved(path):
    return {name: array.asnumpy() for name, array in mx.nd.load(str(path)).items()}


@pytest.mark.slow  # three 2-rank jobs of ResNet-18: half a minute of CPU
def test_every_option_keeps_the_replicas_identical_and_resumes_exactly(tmp_path):
    """Every array on both ranks, the moving average's included, is identical in an
    uninterrupted run, in one stopped at step 1 (inside epoch 1, still mixing, between two
    updates of the average) and in its resumed run; the resumed run ends where the
    uninterrupted one does; what was saved is what rank 0 held."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    _, uninterrupted, _ = run_ranks(launcher("ranks"), whole,
                                    EVERYTHING + ["--output-dir", str(whole / "out")])
    _, stopped, _ = run_ranks(launcher("ranks"), parts, EVERYTHING + [
        "--output-dir", str(parts / "out"), "--max-steps", "1"])
    assert_same_params(stopped[0], stopped[1])
    results, resumed, out = run_ranks(launcher("ranks"), parts, EVERYTHING + [
        "--output-dir", str(parts / "out"), "--resume", "auto"])
    assert "epoch 0, step 1" in out, out[-3000:]
    for arrays in (uninterrupted, resumed):
        assert any(name.startswith("ema:") and name.endswith("running_var")
                   for name in arrays[0])
        assert_same_params(arrays[0], arrays[1])
    # Per unit of magnitude (helpers.assert_arrays_close): the stop averaged the running
    # statistics over the ranks once more than the uninterrupted run, in float32.
    assert_same_model(uninterrupted[0], resumed[0])
    assert results[0]["steps"] == 6
    ema = {name[len("ema:"):]: a for name, a in resumed[0].items() if name.startswith("ema:")}
    assert_same_params(saved(parts / "out" / "model-ema.params"), ema)
    assert_same_params(saved(parts / "out" / "checkpoints" / "epoch-0002" / "ema.params"), ema)
    records = [json.loads(l) for l in (parts / "out" / "metrics.jsonl").read_text().splitlines()]
    measured = [(r["epoch"], r["train_acc_measures"]) for r in records if r["event"] == "epoch"]
    assert measured == [(0, "dominant label"), (1, "label")]
