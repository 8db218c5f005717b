"""What a run on images writes about skipped samples and about a stop inside an epoch (run
in-process: one rank, no store)."""
import json
import logging
import os
from types import SimpleNamespace

from helpers import bad_copy, main_in_process
from hvdtrain.loop.run.fit import count_skipped

ARGS = ["--no-cuda", "--kvstore", "none", "--image-size", "16", "--batch-size", "64",
        "--model", "pool_cnn", "--log-interval", "0", "--data-workers", "1"]


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as src:
        return [json.loads(line) for line in src]


def test_train_and_val_skips_are_counted_apart_and_a_stop_records_what_an_epoch_does(
        digit_images, tmp_path, capfd):
    bad_folder, _, _, _ = bad_copy(*digit_images, tmp_path)
    val_dir = os.path.join(bad_folder, "val", "digit2")
    for name in sorted(os.listdir(val_dir))[:2]:  # two validation images that are no JPEG
        with open(os.path.join(val_dir, name), "wb") as out:
            out.write(b"\xff\xd8 not a jpeg")
    run_dir = str(tmp_path / "run")
    num_val = sum(len(files) for _, _, files in os.walk(os.path.join(bad_folder, "val")))
    # 480 training images at batch 64: 8 steps an epoch; --max-steps 10 stops in epoch 2.
    # Three bad samples are more than the default limit (1% of a split) allows.
    code, lines = main_in_process(["--dataset", "imagefolder", "--data-dir", bad_folder,
                                   *ARGS, "--epochs", "2", "--max-steps", "10",
                                   "--max-bad-samples", "2", "--output-dir", run_dir], capfd)
    assert code == 0, lines
    records = _records(run_dir)
    epoch = [r for r in records if r["event"] == "epoch"]
    stop = [r for r in records if r["event"] == "stop"]
    assert len(epoch) == 1 and len(stop) == 1, records
    # The corrupt training JPEG was met in epoch 1 (every sample once) and both bad
    # validation images in each evaluation.
    assert epoch[0]["skipped_train_samples"] == 1 and epoch[0]["skipped_val_samples"] == 2
    assert stop[0]["skipped_val_samples"] == 2
    # The counts a reader checks coverage with: every usable sample once.
    assert epoch[0]["train_samples"] == 480 - 1, epoch[0]
    assert epoch[0]["test_samples"] == stop[0]["test_samples"] == num_val - 2
    assert stop[0]["train_samples"] == 2 * 64  # steps 9 and 10, in epoch 2
    missing = set(epoch[0]) - set(stop[0]) - {"event", "time"}
    assert not missing, missing
    assert stop[0]["num_workers"] == 1 and stop[0]["batch_size"] == 64
    stopped = [l for l in lines if "stopped at step 10" in l]
    assert len(stopped) == 1 and f"top-5 {stop[0]['test_top5']:.4f}" in stopped[0], lines


def test_only_rank_0_warns_the_epoch_totals(caplog):
    # The training count is the steps' (the epoch's), not the loader's, which decodes ahead.
    stats, test_loader = SimpleNamespace(epoch_skipped=1), SimpleNamespace(skipped=[])
    caplog.set_level(logging.WARNING, logger="hvdtrain")
    for rank in (1, 0):
        dist = SimpleNamespace(synchronous=True, rank=rank, sum_across_workers=lambda _, v: v)
        assert count_skipped(stats, test_loader, dist, 0) == dict(skipped_train_samples=1,
                                                                   skipped_val_samples=0)
    totals = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(totals) == 1 and "1 training and 0 validation" in totals[0].getMessage()


def test_an_unevaluated_epoch_counts_no_validation_samples():
    """A stop that skips the evaluation has no validation count: not the last
    evaluation's, which the loader still holds."""
    stats, test_loader = SimpleNamespace(epoch_skipped=0), SimpleNamespace(skipped=["x", "y"])
    dist = SimpleNamespace(synchronous=True, rank=0, sum_across_workers=lambda _, v: v)
    assert count_skipped(stats, test_loader, dist, 3, evaluated=False) == dict(
        skipped_train_samples=0, skipped_val_samples=None)
