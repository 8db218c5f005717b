"""Resume continues exactly where a run stopped, mid-epoch included, on the real launchers."""
import fcntl
import json
import os

import pytest

from helpers import run_command, split_by_process, tool
from jobs import DIGITS, JOB_TIMEOUT, assert_same_params, launcher, run_ranks

pytestmark = pytest.mark.dist
# 1437 training digits over 2 ranks x batch 64: 12 steps per epoch.
FLAGS = DIGITS + ["--lr", "0.05", "--batch-size", "64"]


def _stop_and_resume(tmp_path, flags, stop_at, epochs):
    """(straight, resumed) per-rank parameters and the resumed run's results."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    straight.mkdir()
    stopped.mkdir()
    hvd = launcher("horovodrun-gloo")
    _, full, _ = run_ranks(hvd, straight, flags + ["--epochs", str(epochs),
                                                   "--output-dir", str(straight)])
    run_ranks(hvd, stopped, flags + ["--epochs", str(epochs), "--max-steps", str(stop_at),
                                     "--output-dir", str(stopped)])
    results, resumed, out = run_ranks(hvd, stopped, flags + [
        "--epochs", str(epochs), "--output-dir", str(stopped), "--resume", "auto"])
    return full, resumed, results, out


def test_mid_epoch_stop_resumes_exactly(tmp_path):
    full, resumed, results, out = _stop_and_resume(
        tmp_path, FLAGS + ["--model", "simple_cnn"], stop_at=5, epochs=2)
    for rank in (0, 1):
        assert_same_params(full[rank], resumed[rank], tol=1e-5)
    assert results[0]["steps"] == 2 * 12
    assert "640 samples into epoch 1" in out, out[-3000:]  # 5 steps x global batch 128
    stopped = tmp_path / "stopped"
    meta = json.loads((stopped / "checkpoints" / "epoch-0000-step-0000005" /
                       "meta.json").read_text())
    assert (meta["epoch"], meta["step"], meta["epoch_samples"]) == (0, 5, 640)
    events = [json.loads(l)["event"] for l in (stopped / "metrics.jsonl").read_text()
              .splitlines()]
    # The stop is not an epoch: epoch 0 is recorded once, by the run that finished it.
    assert events == ["start", "stop", "end", "start", "epoch", "epoch", "end"]


def test_mid_epoch_resume_across_warmup_and_decay(tmp_path):
    """Warm-up over the first 6 steps, stop inside epoch 2 (step 17), decay at epoch 3 in
    the resumed leg: the learning rate continues from its position."""
    flags = FLAGS + ["--model", "simple_cnn", "--warmup-epochs", "0.5",
                     "--lr-decay-epochs", "2", "--lr-decay-factor", "0.2"]
    full, resumed, _, out = _stop_and_resume(tmp_path, flags, stop_at=17, epochs=3)
    for rank in (0, 1):
        assert_same_params(full[rank], resumed[rank], tol=1e-5)
    assert "epoch 1, step 17" in out, out[-3000:]


# resnet18_v1 (the default model) trains three runs of a ResNet-18 on the CPU: minutes.
@pytest.mark.parametrize("model", ["bn_cnn", pytest.param("resnet18_v1",
                                                         marks=pytest.mark.slow)])
def test_mid_epoch_resume_with_batchnorm(model, tmp_path):
    """BatchNorm: the running statistics, averaged over ranks before the save, must match
    too (averaging commutes with their moving-average update, so a mid-epoch save that
    averages early changes nothing). resnet18_v1 is the default model."""
    full, resumed, _, _ = _stop_and_resume(tmp_path, FLAGS + ["--model", model],
                                           stop_at=5, epochs=2)
    for rank in (0, 1):
        # Per unit of magnitude: running_var reaches ~100 here (see assert_arrays_close).
        assert_same_params(full[rank], resumed[rank], tol=1e-5)


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
