"""--mixup and --cutmix against a NumPy implementation written from torchvision's rules
(references/classification/transforms.py: RandomMixup, RandomCutmix), on fixed draws.

The reference pairs each sample with the one before it (``np.roll(batch, 1, axis=0)``),
pastes cutmix's box with ``int(0.5 * sqrt(1 - lam) * side)`` half-sides clipped at the
edges, reweights by the box's area, and smooths each one-hot label as
``--label-smoothing`` does, all in NumPy, with nothing of hvdtrain's mixing."""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from hvdtrain import job
from hvdtrain.config import TrainConfig
from hvdtrain.loop.recipe.mixing import MixDraw, Mixing, mixed_batch

CLASSES = 7


def numpy_mix(images, labels, draw, classes=CLASSES, smoothing=0.0):
    """(mixed images, soft targets) as torchvision's reference computes them."""
    rolled, rolled_labels = np.roll(images, 1, axis=0), np.roll(labels, 1)
    lam = draw.lam
    if draw.kind == "mixup":
        mixed = lam * images + (1 - lam) * rolled
    else:
        height, width = images.shape[2:]
        r = 0.5 * np.sqrt(1.0 - lam)
        half_h, half_w = int(r * height), int(r * width)
        cy, cx = draw.centre
        y1, y2 = np.clip(cy - half_h, 0, height), np.clip(cy + half_h, 0, height)
        x1, x2 = np.clip(cx - half_w, 0, width), np.clip(cx + half_w, 0, width)
        mixed = images.copy()
        mixed[:, :, y1:y2, x1:x2] = rolled[:, :, y1:y2, x1:x2]
        lam = 1.0 - (y2 - y1) * (x2 - x1) / (height * width)

    def smooth(y):
        target = np.full((len(y), classes), smoothing / classes)
        target[np.arange(len(y)), y] += 1.0 - smoothing
        return target
    return mixed, lam * smooth(labels) + (1 - lam) * smooth(rolled_labels)


def numpy_cross_entropy(logits, target):
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -(target * log_p).sum(axis=1)


def batch(size, height=8, width=10, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(size, 3, height, width)).astype(np.float32),
            rng.integers(0, CLASSES, size).astype(np.int32))


DRAWS = [
    MixDraw("mixup", 0.3),
    MixDraw("mixup", 0.8),
    MixDraw("cutmix", 0.4, (2, 5)),
    MixDraw("cutmix", 0.25, (0, 9)),   # a box clipped at the top and right edges
    MixDraw("cutmix", 0.9999, (4, 4)),  # a box of no pixels: nothing pasted, lam 1
]


@pytest.mark.parametrize("draw", DRAWS, ids=lambda d: f"{d.kind}-{d.lam}-{d.centre}")
@pytest.mark.parametrize("size", [5, 1], ids=["batch5", "batch1"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_mixed_batch_targets_and_loss_match_numpy(draw, size, smoothing):
    images, labels = batch(size)
    mixing = Mixing(0.2, 1.0, None, seed=0, classes=CLASSES, smoothing=smoothing)
    xs, targets, dominant, idle = mixed_batch(mixing, draw, images, labels, [mx.cpu()])
    want_images, want_targets = numpy_mix(images, labels, draw, smoothing=smoothing)
    assert idle == [] and len(xs) == 1
    np.testing.assert_allclose(xs[0].asnumpy(), want_images, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(targets[0].asnumpy(), want_targets, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(targets[0].asnumpy().sum(axis=1), 1.0, rtol=1e-6)
    # The dominant label: the one the target weights more (the sample's own on a tie).
    own = want_targets[np.arange(size), labels]
    other = want_targets[np.arange(size), np.roll(labels, 1)]
    want_dominant = np.where(own >= other, labels, np.roll(labels, 1))
    np.testing.assert_array_equal(dominant[0].asnumpy(), want_dominant)
    logits = np.random.default_rng(1).normal(size=(size, CLASSES)).astype(np.float32)
    loss = mixing.loss(mx.nd.array(logits), targets[0]).asnumpy()
    np.testing.assert_allclose(loss, numpy_cross_entropy(logits, want_targets), rtol=1e-5)


def test_a_batch_split_over_two_devices_is_mixed_as_a_whole():
    """With several devices a worker mixes its whole batch before splitting it (pairs
    cross the devices' parts), as one device would."""
    images, labels = batch(5)
    mixing = Mixing(0.2, 0.0, None, seed=0, classes=CLASSES)
    draw = MixDraw("mixup", 0.3)
    xs, targets, _, idle = mixed_batch(mixing, draw, images, labels, [mx.cpu(0), mx.cpu(1)])
    want_images, want_targets = numpy_mix(images, labels, draw)
    assert [len(x) for x in xs] == [3, 2] and idle == []
    np.testing.assert_allclose(np.concatenate([x.asnumpy() for x in xs]), want_images,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([t.asnumpy() for t in targets]), want_targets,
                               rtol=1e-6, atol=1e-7)


def test_draws_are_keyed_by_seed_epoch_position_and_rank():
    both = Mixing(0.2, 1.0, None, seed=5, classes=CLASSES)
    first = both.draw(2, 640, 1, 32, 32)
    assert both.draw(2, 640, 1, 32, 32) == first  # no hidden state: a resume repeats it
    others = {both.draw(*key, 32, 32) for key in [(3, 640, 1), (2, 704, 1), (2, 640, 0)]}
    assert first not in others and len(others) == 3
    assert Mixing(0.2, 1.0, None, seed=6, classes=CLASSES).draw(2, 640, 1, 32, 32) != first
    # The choice and the weight do not depend on the images' size, only the box does.
    other_size = both.draw(2, 640, 1, 224, 160)
    assert (other_size.kind, other_size.lam) == (first.kind, first.lam)


def test_draws_follow_torchvisions_choice_and_distributions():
    draws = [Mixing(0.4, 1.0, None, seed=0, classes=CLASSES).draw(0, p, 0, 24, 40)
             for p in range(600)]
    cut = [d for d in draws if d.kind == "cutmix"]
    assert 240 < len(cut) < 360  # each batch takes one of the two, p = 1/2
    assert all(0 <= d.centre[0] < 24 and 0 <= d.centre[1] < 40 for d in cut)
    assert {d.centre for d in cut} != {cut[0].centre}
    for kind, alpha in (("mixup", 0.4), ("cutmix", 1.0)):
        lams = np.array([d.lam for d in draws if d.kind == kind])
        assert np.all((lams >= 0) & (lams <= 1))
        # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
        assert abs(lams.mean() - 0.5) < 0.06
        assert abs(lams.var() - 1 / (4 * (2 * alpha + 1))) < 0.03
    only_mixup = Mixing(0.4, 0.0, None, seed=0, classes=CLASSES)
    only_cutmix = Mixing(0.0, 1.0, None, seed=0, classes=CLASSES)
    assert {only_mixup.draw(0, p, 0, 8, 8).kind for p in range(50)} == {"mixup"}
    assert {only_cutmix.draw(0, p, 0, 8, 8).kind for p in range(50)} == {"cutmix"}


def test_mixing_stops_at_the_off_epoch():
    mixing = Mixing(0.2, 0.0, 3, seed=0, classes=CLASSES)
    assert [mixing.active(e) for e in range(5)] == [True, True, True, False, False]
    assert Mixing(0.2, 0.0, None, seed=0, classes=CLASSES).active(1000)


def records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_training_mixes_each_batch_with_its_own_draw_and_says_what_accuracy_counts(
        tmp_path, monkeypatch):
    """Through hvdtrain's loop: each batch is mixed with the draw of its position in the
    epoch (one worker, batch 32: positions 0, 32, 64, ...), only before --mix-off-epoch, and
    the metrics say what train_acc counted in each epoch."""
    seen = []
    real_mix = Mixing.mix

    def recording_mix(self, images, labels, draw):
        out = real_mix(self, images, labels, draw)
        seen.append((draw, images.asnumpy(), labels.asnumpy().astype(int), out[0].asnumpy(),
                     out[1].asnumpy()))
        return out

    monkeypatch.setattr(Mixing, "mix", recording_mix)
    cfg = TrainConfig(dataset="digits", no_cuda=True, kvstore="none", model="mlp",
                      batch_size=32, epochs=2, mixup=0.2, cutmix=1.0, mix_off_epoch=1,
                      label_smoothing=0.1, log_interval=0, progress=False, seed=3,
                      output_dir=str(tmp_path))
    job.train(cfg)
    assert len(seen) == 45  # 1437 samples: 45 batches in epoch 1, none in epoch 2
    check = Mixing(0.2, 1.0, None, seed=3, classes=10)
    for number, (draw, images, labels, mixed, targets) in enumerate(seen):
        assert draw == check.draw(0, 32 * number, 0, 8, 8)
        want_images, want_targets = numpy_mix(images, labels, draw, classes=10,
                                              smoothing=0.1)
        np.testing.assert_allclose(mixed, want_images, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(targets, want_targets, rtol=1e-6, atol=1e-7)
    epochs = [r for r in records(tmp_path) if r["event"] == "epoch"]
    assert [r["train_acc_measures"] for r in epochs] == ["dominant label", "label"]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])[
        "config"]["mix_off_epoch"] == 1


def image_folder(root, size=16, per_class=5):
    """train/ and val/ of two classes of random PNGs, and one zero-byte JPEG in train."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            os.makedirs(os.path.join(root, split, cls))
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(os.path.join(root, split, cls, f"{i}.png"))
    open(os.path.join(root, "train", "a", "9-empty.jpg"), "wb").close()
    return root


def test_a_batch_a_streamed_loader_shrank_is_mixed_as_it_is(tmp_path):
    """An unusable sample leaves its batch one short (3 of 4, one batch here): mixing pairs
    the samples it has, and training goes on."""
    folder = image_folder(str(tmp_path / "images"))
    cfg = TrainConfig(dataset="imagefolder", data_dir=folder, image_size=16, no_cuda=True,
                      kvstore="none", model="simple_cnn", batch_size=4, epochs=2,
                      mixup=0.4, cutmix=1.0, data_workers=0, log_interval=0, progress=False,
                      max_bad_samples="1", output_dir=str(tmp_path / "run"))
    job.train(cfg)
    epochs = [r for r in records(tmp_path / "run") if r["event"] == "epoch"]
    assert [(r["train_samples"], r["skipped_train_samples"]) for r in epochs] == [(10, 1)] * 2
    assert all(np.isfinite(r["train_loss"]) for r in epochs)
