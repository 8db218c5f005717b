"""An epoch stopped and resumed inside counts its unusable samples as an epoch run whole does:
the stop's record counts what its steps left out (not the batches the loader had decoded
ahead), and ``--max-bad-samples`` holds the whole epoch, both parts, to its limit. Run in
this process: one rank, no store."""
import json
import os
import shutil

from helpers import main_in_process
from hvdtrain.data.images import open_folder
from hvdtrain.data.sampler import SplitSampler

BATCH = 64  # 480 training images: 8 steps an epoch
ARGS = ["--dataset", "imagefolder", "--no-cuda", "--kvstore", "none", "--image-size", "16",
        "--batch-size", str(BATCH), "--model", "pool_cnn", "--log-interval", "0",
        "--data-workers", "2", "--epochs", "1"]
# Where the bad files sit in epoch 1's order: 3 in the 3 steps before a stop at step 3, 2 in
# the next batch (decoded ahead of the stop with 2 data workers, trained after the resume),
# 2 later on.
BEFORE, AHEAD, LATER = (5, 70, 150), (200, 230), (340, 450)


def _spoil(folder):
    """Make the training files at the positions above undecodable; returns the folder."""
    _, train, _ = open_folder(folder)
    sampler = SplitSampler(len(train), shuffle=True, seed=42)  # --seed's default
    sampler.set_epoch(0)
    order = sampler.permutation()
    for position in BEFORE + AHEAD + LATER:
        path = os.path.join(folder, "train", train.describe(int(order[position])))
        with open(path, "wb") as out:
            out.write(b"\xff\xd8 not a jpeg")
    return folder


def _records(run_dir, event):
    with open(os.path.join(run_dir, "metrics.jsonl")) as src:
        return [r for r in map(json.loads, src) if r["event"] == event]


def test_a_stop_and_its_resume_count_and_limit_the_epoch_as_one_run(digit_images, tmp_path,
                                                                    capfd):
    folder = _spoil(shutil.copytree(digit_images[0], str(tmp_path / "images")))
    bad = len(BEFORE + AHEAD + LATER)
    data = ["--data-dir", folder, *ARGS]
    # The whole epoch in one run is over a limit of 5.
    code, lines = main_in_process([*data, "--max-bad-samples", "5"], capfd)
    assert code == 2 and "more than --max-bad-samples 5" in lines[-1], lines
    stopped = str(tmp_path / "stopped")
    code, lines = main_in_process([*data, "--max-bad-samples", "5", "--max-steps", "3",
                                   "--output-dir", stopped], capfd)
    assert code == 0, lines
    stop, = _records(stopped, "stop")
    assert stop["step"] == 3 and stop["skipped_train_samples"] == len(BEFORE), stop
    # Resumed, the epoch is still held to 5: 3 before the stop and 4 after are 7.
    again = str(tmp_path / "again")
    shutil.copytree(stopped, again)
    code, lines = main_in_process([*data, "--max-bad-samples", "5", "--resume", "auto",
                                   "--output-dir", again], capfd)
    assert code == 2 and f"{bad - 1} of its 480 samples" in lines[-1], lines
    # With room for all of them, the epoch's record counts both parts.
    code, lines = main_in_process([*data, "--max-bad-samples", str(bad), "--resume", "auto",
                                   "--output-dir", stopped], capfd)
    assert code == 0, lines
    epoch, = _records(stopped, "epoch")
    assert epoch["skipped_train_samples"] == bad, epoch
    # ... while the samples trained are this run's part: the positions after step 3's.
    assert epoch["train_samples"] == 480 - 3 * BATCH - len(AHEAD + LATER), epoch
