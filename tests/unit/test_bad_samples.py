"""Unusable samples contribute nothing, are counted, and past a limit end the job in one line
(run in-process: one rank, no store)."""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from helpers import main_in_process
from hvdtrain.data.images import FolderSplit
from hvdtrain.data.sampler import SplitSampler
from hvdtrain.data.streamed import ImageLoader
from hvdtrain.loop.engine.batches import split_batch
from hvdtrain.loop.engine.counts import StepCounts, allowed_bad, check_bad_samples
from hvdtrain.loop.engine.device_metrics import DeviceAccuracy
from hvdtrain.data.datasets import DatasetError
from hvdtrain.store.dist import DistContext

ARGS = ["--dataset", "imagefolder", "--no-cuda", "--kvstore", "none", "--image-size", "16",
        "--model", "simple_cnn", "--log-interval", "0", "--data-workers", "0",
        "--batch-size", "8", "--epochs", "1"]


def write_folder(root, good, bad, bad_val=0):
    """train/ and val/ with classes a and b: `good` PNGs a class in each split, plus `bad`
    (train) and `bad_val` (val) zero-byte files in class a, named to sort first."""
    rng = np.random.default_rng(0)
    for split, broken in (("train", bad), ("val", bad_val)):
        for cls in ("a", "b"):
            folder = os.path.join(root, split, cls)
            os.makedirs(folder)
            for i in range(good):
                pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(os.path.join(folder, f"{i + 100}.png"))
            if cls == "a":
                for i in range(broken):
                    open(os.path.join(folder, f"0{i}-broken.png"), "wb").close()
    return root


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as src:
        return [json.loads(line) for line in src]


def test_limits_read_as_counts_or_shares():
    assert allowed_bad("1%", 40) == 0 and allowed_bad("1%", 100) == 1
    assert allowed_bad("2.5%", 40) == 1 and allowed_bad("7", 3) == 7
    check_bad_samples("training", 1, 40, "1", [], 0)  # at the limit: goes on
    with pytest.raises(DatasetError, match="2 of its 40 samples .* allows \\(1\\).*x.png: cannot"):
        check_bad_samples("training", 2, 40, "1", ["x.png: cannot decode"], 0)
    with pytest.raises(DatasetError, match="none of its samples could be used"):
        check_bad_samples("validation", 3, 40, "10", [], 0, used=0)


@pytest.mark.parametrize("text", ["abc", "-1", "101%", "1.5"])
def test_a_limit_that_is_neither_count_nor_share_is_a_usage_error(text, capfd):
    code, lines = main_in_process(ARGS + ["--max-bad-samples", text], capfd)
    assert code == 2 and len(lines) == 1 and "--max-bad-samples" in lines[-1], lines


def test_one_worker_counts_are_its_own():
    counts = StepCounts(DistContext(), exchange=False)
    counts.submit(7, 1)
    assert counts.result() == (7, 1, ())


def test_a_batch_whose_every_sample_fails_is_empty_not_garbage(tmp_path):
    root = write_folder(str(tmp_path / "set"), good=4, bad=4)
    split = FolderSplit(os.path.join(root, "train"), ["a", "b"])
    sampler = SplitSampler(len(split), 1, 0, shuffle=False)
    loader = ImageLoader(split, sampler, 4, train=False, image_size=16, data_workers=0)
    batches = list(loader)
    # The four broken files sort first in class a: the whole first batch failed.
    assert [len(labels) for _, labels in batches] == [0, 4, 4]
    assert batches[0][0].shape == (0, 3, 16, 16)
    assert [l.tolist() for _, l in batches[1:]] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert len(loader.skipped) == 4


def test_unusable_samples_count_nowhere_in_training_or_evaluation(tmp_path, capfd):
    # 8 + 8 usable samples a split; the first batch of each split is 8 broken files.
    root = write_folder(str(tmp_path / "set"), good=8, bad=8, bad_val=8)
    run_dir = str(tmp_path / "run")
    code, lines = main_in_process(ARGS + ["--data-dir", root, "--max-bad-samples", "50%",
                                          "--output-dir", run_dir], capfd)
    assert code == 0, lines
    epoch = [r for r in records(run_dir) if r["event"] == "epoch"][0]
    assert epoch["train_samples"] == 16 and epoch["skipped_train_samples"] == 8
    assert epoch["test_samples"] == 16 and epoch["skipped_val_samples"] == 8
    with open(os.path.join(run_dir, "model.params"), "rb"):
        pass
    # The accuracy is over the 16 usable images alone: a multiple of 1/16.
    assert (epoch["test_acc"] * 16) == pytest.approx(round(epoch["test_acc"] * 16))


def test_past_the_limit_the_job_ends_in_one_line_naming_the_files(tmp_path, capfd):
    root = write_folder(str(tmp_path / "set"), good=20, bad=1)  # 1 of 41: over 1%
    code, lines = main_in_process(ARGS + ["--data-dir", root], capfd)
    errors = [l for l in lines if "error" in l.lower()]
    assert code == 2 and len(errors) == 1, lines
    assert "1 of its 41 samples" in errors[0] and "00-broken.png" in errors[0], errors
    assert "--max-bad-samples" in errors[0] and "Traceback" not in "\n".join(lines)
    # Raised, the job trains on with the file left out.
    code, lines = main_in_process(ARGS + ["--data-dir", root, "--max-bad-samples", "1"], capfd)
    assert code == 0, lines


def test_a_split_where_nothing_decodes_ends_the_job_whatever_the_limit(tmp_path, capfd):
    root = write_folder(str(tmp_path / "set"), good=0, bad=12, bad_val=12)
    for cls in ("a", "b"):  # class b needs a file to be a class: make it broken too
        for split in ("train", "val"):
            open(os.path.join(root, split, cls, "x.png"), "wb").close()
    run_dir = str(tmp_path / "run")
    code, lines = main_in_process(ARGS + ["--data-dir", root, "--max-bad-samples", "100%",
                                          "--output-dir", run_dir], capfd)
    errors = [l for l in lines if "error" in l.lower()]
    assert code == 2 and len(errors) == 1, lines
    assert "none of its samples could be used (14 unusable)" in errors[0], errors
    assert "broken.png: cannot decode (the file is empty" in errors[0] or "x.png: cannot decode (the file is empty" in errors[0]
    assert "no limit lets a run train on nothing" in errors[0]
    assert not os.path.exists(os.path.join(run_dir, "model.params"))


def test_float16_batches_keep_class_numbers_above_2048_exact():
    images = np.zeros((2, 3, 4, 4), np.float32)
    labels = np.array([2049, 3001], np.int32)
    _, ys, _ = split_batch(images, labels, [mx.cpu()], dtype="float16")
    assert ys[0].dtype == np.float32 and ys[0].asnumpy().tolist() == [2049, 3001]
    out = mx.nd.zeros((2, 3002), dtype="float16")
    out[0, 2049] = 1
    out[1, 3001] = 1
    # The accuracy's argmax runs in float32: a float16 one rounds 2049 to 2048.
    accuracy = DeviceAccuracy()
    accuracy.update(ys, [out])
    assert accuracy.get()[1] == 1.0
