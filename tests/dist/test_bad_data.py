"""Unusable samples on one rank's shard never split the replicas, and the update they leave
equals a plain Gluon loop over the samples that could be used.

The ranks meet the bad files at different steps (each step's shard holds at most one of
them), so before the fix the ranks divided the same summed gradient by different counts."""
import dataclasses
import json
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from helpers import assert_arrays_close, run_command, tool
from hvdtrain.config import TrainConfig
from hvdtrain.data.images import read_idx
from hvdtrain.models import build_model
from jobs import assert_same_params, launcher, run_ranks

pytestmark = pytest.mark.dist

SIZE = 32
# No augmentation that changes the pixels of a square, left-right symmetric image: the crop
# is the whole image, a flip changes nothing, no colour change. The training input is then
# the normalised image, which a reference can compute on its own.
FLAGS = ["--dataset", "imagefolder", "--no-cuda", "--log-interval", "0", "--image-size",
         str(SIZE), "--model", "simple_cnn", "--batch-size", "4", "--lr", "0.1",
         "--min-crop-area", "1", "--colour-jitter", "0", "--pca-noise", "0",
         "--data-workers", "1", "--max-bad-samples", "5"]
MEAN = np.array([0.485, 0.456, 0.406], np.float32)  # ImageNet's, as torchvision states them
STD = np.array([0.229, 0.224, 0.225], np.float32)
LR = 0.02  # the reference test's: small enough that three steps stay well-conditioned


def symmetric_images(root, train_per_class, val_per_class=4, seed=0):
    """train/ and val/ with classes c0 and c1 of random left-right symmetric PNGs."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for cls in ("c0", "c1"):
            os.makedirs(os.path.join(root, split, cls))
            for i in range(count):
                half = rng.integers(0, 256, (SIZE, SIZE // 2, 3), dtype=np.uint8)
                pixels = np.concatenate([half, half[:, ::-1]], axis=1)
                Image.fromarray(pixels).save(os.path.join(root, split, cls, f"{i:03d}.png"))
    return root


def add_bad_jpegs(root):
    """A zero-byte JPEG in c0 and a truncated one (a real JPEG cut after its header) in c1."""
    open(os.path.join(root, "train", "c0", "050-empty.jpg"), "wb").close()
    whole = os.path.join(root, "train", "c1", "050-cut.jpg")
    Image.fromarray(np.full((SIZE, SIZE, 3), 128, np.uint8)).save(whole, quality=90)
    with open(whole, "r+b") as out:
        out.truncate(300)
    return 2


@pytest.fixture(scope="module")
def bad_sets(tmp_path_factory):
    """(an image folder with two bad JPEGs among 40, a pack of 40 with one damaged record)."""
    base = tmp_path_factory.mktemp("bad-data")
    folder = symmetric_images(str(base / "folder"), train_per_class=20)
    pack = str(base / "pack")
    proc = run_command([tool("hvdtrain-pack"), folder, pack], timeout=300)
    assert proc.returncode == 0, proc.stdout
    add_bad_jpegs(folder)
    _, offsets = read_idx(os.path.join(pack, "train.idx"))
    with open(os.path.join(pack, "train.rec"), "r+b") as out:
        out.seek(int(offsets[13]))
        out.write(b"\xff" * 8)  # record 13's magic and length gone
    return folder, pack


def ps_launcher(ranks):
    return [tool("hvdtrain-launch"), "-n", str(ranks), "-s", "1"]


# (data, ranks, extra flags): the folder and the pack, 2 and 3 ranks, accumulation, buckets
# of one gradient each and the default buckets, float16 on the wire, the parameter server;
# the training recipe (an EMA updated every step, mixup and cutmix over batches of different
# sizes, no-wd, and clipping at a norm that some steps exceed and some do not: clipping
# every step would hide a wrong divisor, the factor cancelling it), alone and with PowerSGD.
RECIPE = ["--ema", "0.9", "--ema-every", "1", "--no-wd", "--clip-grad-norm"]
CASES = {
    "folder-2-default-buckets": ("folder", 2, []),
    "folder-3-accumulate": ("folder", 3, ["--accumulate", "2"]),
    "folder-2-unbucketed-fp16": ("folder", 2, ["--grad-bucket-mb", "0", "--fp16-allreduce"]),
    "pack-2-accumulate-unbucketed": ("pack", 2, ["--accumulate", "2", "--grad-bucket-mb", "0"]),
    "pack-3-default-buckets": ("pack", 3, ["--model", "bn_cnn"]),
    "folder-2-dist-sync": ("folder", 2, ["--kvstore", "dist_sync"]),
    "folder-2-recipe": ("folder", 2, ["--model", "bn_cnn", "--mixup", "0.2", "--cutmix", "1.0"]
                        + RECIPE + ["0.5"]),
    "pack-2-powersgd-recipe": ("pack", 2, ["--compression", "powersgd",
                                           "--powersgd-start-step", "0", "--lr", "0.02"]
                               + RECIPE + ["100"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_samples_on_one_shard_leave_every_rank_identical(case, bad_sets, tmp_path):
    data, ranks, extra = CASES[case]
    folder, pack = bad_sets
    flags = FLAGS + ["--epochs", "2", "--data-dir", folder if data == "folder" else pack,
                     "--output-dir", str(tmp_path / "run")] + extra
    if data == "pack":
        flags[flags.index("imagefolder")] = "recordio"
    prefix = ps_launcher(ranks) if "--kvstore" in extra else launcher("ranks", ranks)
    results, params, log = run_ranks(prefix, tmp_path, flags)
    assert len(results) == ranks
    for other in params[1:]:
        assert_same_params(params[0], other)
    bad = 2 if data == "folder" else 1
    with open(tmp_path / "run" / "metrics.jsonl") as src:
        epochs = [r for r in map(json.loads, src) if r["event"] == "epoch"]
    # Every epoch met each bad sample once, and trained on every other sample at least
    # once (the padding that evens the shards out may repeat a few).
    assert [e["skipped_train_samples"] for e in epochs] == [bad, bad], epochs
    assert all(e["train_samples"] >= 40 - (bad if data == "pack" else 0) for e in epochs)
    assert all(e["test_samples"] == 8 for e in epochs)
    if "--clip-grad-norm" in extra:  # the options acted, and their arrays were compared too
        assert 0 < sum(e["clipped_steps"] for e in epochs) < 2 * 5, epochs  # 5+ steps/epoch
        assert any(name.startswith("ema:") for name in params[0])
    if "--compression" in extra:
        assert "PowerSGD rank" in log, log[-3000:]
    assert "Traceback" not in log


def normalised(path):
    """A training input as the definition gives it: (pixels / 255 - mean) / std, CHW."""
    pixels = np.asarray(Image.open(path).convert("RGB"), np.float32) / 255
    return ((pixels - MEAN) / STD).transpose(2, 0, 1)


def plain_gluon_steps(start, images, labels, steps):
    """`steps` SGD steps of a plain one-process Gluon Trainer over the whole batch, from the
    parameters `start` (as rank_worker.py names them); the options are TrainConfig's."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    net = build_model("simple_cnn", 2)
    net.initialize(ctx=mx.cpu())
    net(mx.nd.zeros((1, 3, SIZE, SIZE)))
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(start[name]))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {
        "learning_rate": LR, "momentum": defaults["momentum"], "wd": defaults["wd"]})
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = mx.nd.array(np.stack(images)), mx.nd.array(labels)
    for _ in range(steps):
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(len(labels))
    return {name: p.data().asnumpy() for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def test_one_bad_sample_gives_the_update_of_a_plain_loop_without_it(tmp_path):
    # 16 positions: every step is the whole set (2 ranks x batch 8), one of them a zero-byte
    # file, so one rank uses 7 samples and the other 8 in every step.
    folder = symmetric_images(str(tmp_path / "set"), train_per_class=8, val_per_class=2)
    os.remove(os.path.join(folder, "train", "c1", "007.png"))
    open(os.path.join(folder, "train", "c1", "007.png"), "wb").close()
    flags = FLAGS + ["--batch-size", "8", "--epochs", "3", "--data-dir", folder,
                     "--max-bad-samples", "1", "--lr", str(LR)]
    os.makedirs(tmp_path / "out")
    results, params, _ = run_ranks(launcher("ranks", 2), tmp_path / "out", flags,
                                   env={"HVDTRAIN_DUMP_START": "1"})
    assert results[0]["steps"] == 3
    assert_same_params(params[0], params[1])
    start = dict(np.load(tmp_path / "out" / "rank0-start.npz"))
    good = [(os.path.join(folder, "train", c, f), label)
            for label, c in enumerate(("c0", "c1"))
            for f in sorted(os.listdir(os.path.join(folder, "train", c)))
            if os.path.getsize(os.path.join(folder, "train", c, f))]
    assert len(good) == 15
    expected = plain_gluon_steps(start, [normalised(p) for p, _ in good],
                                 [label for _, label in good], steps=3)
    for name, value in expected.items():
        assert_arrays_close(params[0][name], value, tol=1e-5, what=name)
    # The reference moved: the comparison is not of two untouched starts.
    assert not np.allclose(expected["5.weight"], start["5.weight"])


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_rank_whose_whole_step_is_unusable_applies_the_same_loss_scale(ranks, bad_sets,
                                                                         tmp_path):
    """One sample per rank and step: a bad file makes that rank's whole step empty (no
    forward or backward pass), under AMP's loss scaling with a scale that changes at every
    update and an overflow now and then (tests/dist/amp_stand_in.py), with clipping (some
    steps clipped, some not) and PowerSGD. Every array stays identical across ranks (before:
    the empty rank divided the summed gradient by the loss scale of the step before)."""
    folder, _ = bad_sets
    flags = FLAGS + ["--batch-size", "1", "--epochs", "1", "--data-dir", folder,
                     "--model", "bn_cnn", "--compression", "powersgd", "--powersgd-start-step",
                     "0", "--powersgd-rank", "2", "--lr", "0.02", "--clip-grad-norm", "2",
                     "--output-dir", str(tmp_path / "run")]
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "amp_stand_in.py")
    cmd = launcher("ranks", ranks) + [sys.executable, program, str(tmp_path)] + flags
    proc = run_command(cmd, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    params = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(ranks)]
    for other in params[1:]:
        assert_same_params(params[0], other)
    with open(tmp_path / "run" / "metrics.jsonl") as src:
        epoch, = [r for r in map(json.loads, src) if r["event"] == "epoch"]
    steps = -(-42 // ranks)
    assert epoch["skipped_train_samples"] == 2 and epoch["step"] == steps, epoch
    assert 0 < epoch["clipped_steps"] < steps, epoch
    assert "PowerSGD rank 2" in proc.stdout and "Traceback" not in proc.stdout
