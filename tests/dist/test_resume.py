"""Resume continues exactly where a run stopped, mid-epoch included, on the real launchers."""
import fcntl
import json
import os

import pytest

from helpers import run_command, split_by_process, tool
from jobs import DIGITS, JOB_TIMEOUT, assert_same_model, assert_same_params, launcher, run_ranks

pytestmark = pytest.mark.dist
# 1437 training digits over 2 ranks x batch 64: 12 steps per epoch.
FLAGS = DIGITS + ["--lr", "0.05", "--batch-size", "64"]
# One configuration carries everything a resume must restore, so one uninterrupted run
# serves as the reference of both resume tests below: bn_cnn's BatchNorm running statistics
# (averaged over ranks before each save), a warm-up over the first 6 steps and a decay by
# 0.2 at epoch 2 (the learning rate continues from its position).
RESUMABLE = FLAGS + ["--model", "bn_cnn", "--warmup-epochs", "0.5", "--lr-decay-epochs", "2",
                     "--lr-decay-factor", "0.2"]
THREE_EPOCHS = ["--epochs", "3"]
HVD = launcher("ranks")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each rank's parameters after an uninterrupted three-epoch run of RESUMABLE."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    _, params, _ = run_ranks(HVD, folder,
                             RESUMABLE + THREE_EPOCHS + ["--output-dir", str(folder)])
    return params


def test_mid_epoch_stop_resumes_exactly(uninterrupted, tmp_path):
    """Stopped at step 17 (inside epoch 2, after the warm-up, before the decay), resumed:
    the same parameters as the run that never stopped, BatchNorm statistics included.
    (This one job replaced three: a plain stop and resume, one across warm-up and decay,
    and one with bn_cnn.)"""
    run_ranks(HVD, tmp_path, RESUMABLE + THREE_EPOCHS + ["--max-steps", "17",
                                                         "--output-dir", str(tmp_path)])
    results, resumed, out = run_ranks(HVD, tmp_path, RESUMABLE + THREE_EPOCHS + [
        "--output-dir", str(tmp_path), "--resume", "auto"])
    for rank in (0, 1):  # the weights bit for bit; the statistics averaged once more
        assert_same_model(uninterrupted[rank], resumed[rank])
    assert results[0]["steps"] == 3 * 12
    # 5 steps x global batch 128 into epoch 2.
    assert "epoch 1, step 17, 640 samples into epoch 2" in out, out[-3000:]
    meta = json.loads((tmp_path / "checkpoints" / "epoch-0001-step-0000017" /
                       "meta.json").read_text())
    assert (meta["epoch"], meta["step"], meta["epoch_samples"]) == (1, 17, 640)
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # The stop is not an epoch: epoch 1 is recorded once, by the run that finished it.
    assert [r["event"] for r in records] == ["start", "epoch", "stop", "end",
                                             "start", "epoch", "epoch", "end"]
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == [0, 1, 2]


def test_resume_from_an_epoch_end_matches_an_uninterrupted_run(uninterrupted, tmp_path):
    """One epoch, then a resume to three: the same parameters on both ranks as the run that
    never stopped. (It replaced test_reliability.py's test_resume_matches_an_uninterrupted_run,
    which ran simple_cnn and bn_cnn each with a reference of its own.)"""
    run_ranks(HVD, tmp_path, RESUMABLE + ["--epochs", "1", "--output-dir", str(tmp_path)])
    results, resumed, out = run_ranks(HVD, tmp_path, RESUMABLE + THREE_EPOCHS + [
        "--output-dir", str(tmp_path), "--resume", "auto"])
    assert "resumed from" in out and "epoch 1, step 12" in out, out[-3000:]
    assert results[0]["steps"] == 3 * 12
    for rank in (0, 1):  # an epoch's end averages the statistics in either run
        assert_same_params(uninterrupted[rank], resumed[rank])
    assert_same_params(resumed[0], resumed[1])
    # Both runs appended to one metrics file: epochs 0 and then 1, 2.
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == [0, 1, 2]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0001", "epoch-0002",
                                                           "epoch-0003", "latest"]


# resnet18_v1 (the default model) trains three runs of a ResNet-18 on the CPU: minutes.
@pytest.mark.slow
def test_mid_epoch_resume_of_the_default_model(tmp_path):
    """resnet18_v1, hvdtrain's default model: stopped at step 3 of its epoch's 6 and
    resumed, it ends where an uninterrupted run ends. (Batch 128 a rank: a step of ResNet-18
    on 8x8 digits costs about what its parameters cost, so fewer, larger steps.)"""
    flags = FLAGS + ["--model", "resnet18_v1", "--epochs", "1", "--batch-size", "128"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    straight.mkdir()
    stopped.mkdir()
    _, full, _ = run_ranks(HVD, straight, flags + ["--output-dir", str(straight)])
    run_ranks(HVD, stopped, flags + ["--max-steps", "3", "--output-dir", str(stopped)])
    _, resumed, _ = run_ranks(HVD, stopped, flags + ["--output-dir", str(stopped),
                                                     "--resume", "auto"])
    for rank in (0, 1):
        assert_same_model(full[rank], resumed[rank])


def test_dist_async_resumes_with_two_workers(tmp_path):
    """Asynchronous workers have no collective to agree on the checkpoint with: the resume
    says so and goes on (it used to raise)."""
    ps_launch = [tool("hvdtrain-launch"), "-n", "2", "-s", "1"]
    flags = DIGITS + ["--kvstore", "dist_async", "--lr", "0.05", "--output-dir", str(tmp_path)]
    run_ranks(ps_launch, tmp_path, flags + ["--epochs", "1"])
    results, _, out = run_ranks(ps_launch, tmp_path, flags + ["--epochs", "2", "--resume",
                                                              "auto"])
    assert "the workers cannot compare which checkpoint each found" in out, out[-3000:]
    assert "resumed from" in out and "epoch-0001: epoch 1, step 12" in out
    assert [r["steps"] for r in results] == [24, 24]  # 12 per epoch per worker
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0001", "epoch-0002",
                                                           "latest"]


def test_a_folder_in_use_is_refused_on_every_rank(tmp_path):
    """Every rank sees the lock before it reads anything (a run that only learned of it at
    rank 0 would leave the others waiting for rank 0 at the next collective). Rank 0 starts
    5 s late, so rank 1 meets the lock alone and must refuse by itself; the first rank to
    exit makes Gloo's launcher terminate the other, so rank 0 may be stopped before it
    prints, but may do nothing else."""
    out = tmp_path / "run"
    out.mkdir()
    rank_0_late = 'if [ "$HOROVOD_RANK" = 0 ]; then sleep 5; fi; exec "$0" "$@"'
    with open(out / ".hvdtrain.lock", "a+") as held:  # another run's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_command(launcher("horovodrun-gloo") + [
            "sh", "-c", rank_0_late, tool("hvdtrain"), *FLAGS, "--epochs", "1",
            "--output-dir", str(out)], timeout=JOB_TIMEOUT)
    assert proc.returncode != 0
    said = {who: [l for l in lines if l.strip()]
            for who, lines in split_by_process(proc.stdout).items()}
    refusal = [f"hvdtrain: error: --output-dir {out} is in use by another run (another "
               "process): wait for it to end, or give another --output-dir"]
    assert said.get("rank 1") == refusal, proc.stdout[-3000:]
    assert said.get("rank 0", []) in ([], refusal, ["Terminated"]), proc.stdout[-3000:]
    assert sorted(os.listdir(out)) == [".hvdtrain.lock"]
