"""Fine-tuning proven end to end: a model trained on one set of generated digit images (set A:
digit0..digit4) and fine-tuned with ``--init-from`` on a disjoint set of classes with few
images (set B: digit5..digit9, 20 training images a class) beats the same model trained on
B from scratch for the same epochs, by a margin set from measured runs. The fine-tune runs
on 2 ranks, its first epoch with the backbone frozen: every rank starts from A's backbone,
the frozen arrays neither change nor travel in that epoch, and then they train.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
import pytest

from helpers import class_subset, run_command, tool
from jobs import HERE, launcher

pytestmark = pytest.mark.dist

FLAGS = ["--dataset", "imagefolder", "--image-size", "16", "--model", "pool_cnn", "--no-cuda",
         "--log-interval", "0", "--min-crop-area", "1", "--colour-jitter", "0",
         "--pca-noise", "0", "--lr-schedule", "cosine"]
EPOCHS_B = "5"
SCRATCH = ["--lr", "0.05"]
# GluonCV's recipe: a lower rate, the new output layer 10 times faster, here frozen around it
# for the first epoch.
FINE = ["--lr", "0.01", "--head-lr-mult", "10", "--freeze-epochs", "1"]
# Set B's test accuracy after 5 epochs, measured on this 2-core VM (2026-12-03) from the same
# set A run (8 epochs, test accuracy 0.917), seeds 1, 2, 3 and 42 (this test's): fine-tuned
# on 2 ranks 0.514, 0.648, 0.659, 0.587; from scratch (one process) at --lr 0.05 0.380,
# 0.402, 0.341, 0.324, and at its best of --lr 0.01, 0.02, 0.05 and 0.1 for each seed 0.386,
# 0.402, 0.453, 0.386. The smallest gap, 0.128 (seed 1), is above this margin; seed 42's is
# 0.26. A fine-tune that did not transfer would learn no faster than scratch.
MARGIN = 0.1
HEAD = ("13.weight", "13.bias")  # pool_cnn's output layer
TIMEOUT = 600


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Set A trained (one process), set B from scratch (one process, batch 16) and
    fine-tuned from A (2 ranks x batch 8: the same global batch and, with strided sampling,
    the same samples in every step)."""
    from hvdtrain.data.sample_images import write_digit_images
    root = tmp_path_factory.mktemp("finetune")
    write_digit_images(str(root / "digits"))
    set_a = class_subset(str(root / "digits"), str(root / "A"), [f"digit{d}" for d in range(5)])
    set_b = class_subset(str(root / "digits"), str(root / "B"),
                         [f"digit{d}" for d in range(5, 10)], train_per_class=20)
    single = [tool("hvdtrain"), "--kvstore", "none", "--batch-size", "16"] + FLAGS
    proc = run_command(single + ["--lr", "0.05", "--data-dir", set_a, "--epochs", "8",
                                 "--output-dir", str(root / "runA")], timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    scratch = run_command(single + SCRATCH + ["--data-dir", set_b, "--epochs", EPOCHS_B,
                                              "--output-dir", str(root / "scratch")],
                          timeout=TIMEOUT)
    assert scratch.returncode == 0, scratch.stdout[-3000:]
    out = root / "fine"
    out.mkdir()
    cmd = launcher("ranks", 2) + [sys.executable, os.path.join(HERE, "rank_worker.py"),
                                       str(out)]
    fine = run_command(cmd + FLAGS + FINE + ["--batch-size", "8", "--data-dir", set_b,
                                             "--epochs", EPOCHS_B, "--init-from",
                                             str(root / "runA")],
                       timeout=TIMEOUT, env={"HVDTRAIN_DUMP_START": "1",
                                             "HVDTRAIN_DUMP_EPOCHS": "1"})
    assert fine.returncode == 0, fine.stdout[-3000:]
    return root, out, fine.stdout


def _end(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as src:
        return [json.loads(line) for line in src][-1]


def _npz(path):
    return dict(np.load(path))


def test_fine_tuned_beats_training_from_scratch(runs):
    root, out, _ = runs
    scratch = _end(root / "scratch")["test_acc"]
    fine = [json.load(open(out / f"rank{r}.json"))["test_acc"] for r in range(2)]
    assert fine[0] == fine[1]
    assert fine[0] >= scratch + MARGIN, (fine[0], scratch)


def test_every_rank_starts_from_set_as_backbone_and_one_output_layer(runs):
    root, out, stdout = runs
    trained = {k: v.asnumpy() for k, v in mx.nd.load(str(root / "runA" / "model.params")).items()}
    starts = [_npz(out / f"rank{r}-start.npz") for r in range(2)]
    for start in starts:
        for place, array in trained.items():
            if place not in HEAD:
                np.testing.assert_array_equal(start[place], array, err_msg=place)
        assert not np.array_equal(start["13.weight"], trained["13.weight"])
    for place in HEAD:  # rank 0's fresh output layer, broadcast
        np.testing.assert_array_equal(starts[0][place], starts[1][place])
    assert "(the output layer, initialised afresh: the same number of classes, other ones: " \
           "digit5, digit6, digit7 ... here, digit0, digit1, digit2 ... in the file)" in stdout


def test_the_frozen_epoch_changes_and_sends_only_the_output_layer(runs):
    _, out, _ = runs
    for rank in range(2):
        start = _npz(out / f"rank{rank}-start.npz")
        after = [_npz(out / f"rank{rank}-epoch{e}.npz") for e in range(int(EPOCHS_B))]
        exchanged = json.load(open(out / f"rank{rank}-exchanged.json"))
        trained = [p for p in start if not p.endswith(("running_mean", "running_var"))]
        backbone = [p for p in trained if p not in HEAD]
        for place in backbone:
            np.testing.assert_array_equal(after[0][place], start[place], err_msg=place)
            assert not np.array_equal(after[1][place], start[place]), place
        for place in HEAD:
            assert not np.array_equal(after[0][place], start[place]), place
        head_bytes = 4 * sum(start[p].size for p in HEAD)
        all_bytes = 4 * sum(start[p].size for p in trained)
        assert set(exchanged["0"]) == {head_bytes}, exchanged["0"]  # one bucket a step
        assert set(exchanged["1"]) == {all_bytes}, exchanged["1"]
        assert len(exchanged["0"]) == len(exchanged["1"]) == 7  # 100 images / (2 x 8)


def test_a_frozen_backbone_stays_bit_for_bit_at_three_ranks(runs, tmp_path):
    """Three ranks through a frozen epoch: every frozen array (the convolutions, BatchNorm's
    gamma and beta) ends exactly as it started on every rank. They are not running
    statistics: averaging them (as every grad_req='null' array once was) changed some of
    them, since a float32 mean of three equal values is not always that value, and sent the
    whole backbone at every epoch's end. (The running statistics stay too: MXNet 1.9.1 moves
    them in BatchNorm's backward pass, which a frozen backbone skips.)"""
    root, _, _ = runs
    set_b = str(root / "B")
    cmd = launcher("ranks", 3) + [sys.executable, os.path.join(HERE, "rank_worker.py"),
                                       str(tmp_path)]
    proc = run_command(cmd + FLAGS + FINE + ["--batch-size", "8", "--data-dir", set_b,
                                             "--epochs", "1", "--init-from",
                                             str(root / "runA")],
                       timeout=TIMEOUT, env={"HVDTRAIN_DUMP_START": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    for rank in range(3):
        start, end = _npz(tmp_path / f"rank{rank}-start.npz"), _npz(tmp_path / f"rank{rank}.npz")
        frozen = [p for p in start if p not in HEAD]
        assert any(p.endswith("gamma") for p in frozen)
        for place in frozen:
            np.testing.assert_array_equal(end[place], start[place], err_msg=place)
        for place in HEAD:  # and the epoch did train
            assert not np.array_equal(end[place], start[place]), place


def test_a_frozen_epoch_then_training_under_shard_optimizer_ends_as_unsharded(runs, tmp_path):
    """``--freeze-epochs 1 --init-from A --shard-optimizer`` at 2 ranks: the second epoch
    unfreezes the backbone, the gradient buckets change, and the sliced state is gathered
    and cut again for them (issue 63, finding 2: it ended at epoch 2 with "the gradient
    buckets changed after the optimizer state was sliced"). The weights end as the same
    run's without --shard-optimizer (bit for bit: a sum of two is the same in any order)."""
    root, _, _ = runs
    ends = []
    for name, extra in (("sharded", ["--shard-optimizer"]), ("plain", [])):
        out = tmp_path / name
        out.mkdir()
        cmd = launcher("ranks", 2) + [sys.executable, os.path.join(HERE, "rank_worker.py"),
                                      str(out)]
        proc = run_command(cmd + FLAGS + FINE + extra + [
            "--batch-size", "8", "--data-dir", str(root / "B"), "--epochs", "2",
            "--init-from", str(root / "runA")], timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stdout[-3000:]
        ends.append([_npz(out / f"rank{r}.npz") for r in (0, 1)])
    (sharded0, sharded1), (plain, _) = ends
    for place in plain:
        np.testing.assert_array_equal(sharded0[place], sharded1[place], err_msg=place)
        np.testing.assert_array_equal(sharded0[place], plain[place], err_msg=place)
