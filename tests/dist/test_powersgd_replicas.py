"""``--compression powersgd`` through the hvdtrain command at 2 ranks: every array the same
on both ranks (each rank's error differs by design, the model must not), factors on the wire
instead of whole gradients, and a resume that continues PowerSGD's state (tests/dist/
rank_worker.py runs the ranks). The algorithm itself: test_powersgd_reference.py."""
import json
import os
import re
import shutil

import numpy as np
import pytest

from jobs import DIGITS, assert_same_params, launcher, run_ranks

pytestmark = pytest.mark.dist
# pool_cnn: BatchNorm (running statistics averaged over the ranks), one convolution too
# thin to compress at rank 4 (32 x 9), and three matrices that are (64 x 288, 128 x 576,
# 10 x 128). 1437 digits over 2 ranks x batch 64: 12 steps an epoch.
FLAGS = DIGITS + ["--model", "pool_cnn", "--lr", "0.05", "--compression", "powersgd",
                  "--powersgd-start-step", "3"]
HVD = launcher("ranks")


def whole_gradient_bytes(params):
    return 4 * sum(a.size for name, a in params.items()
                   if not name.endswith(("running_mean", "running_var")))


@pytest.mark.parametrize("extra", [[], ["--fp16-allreduce", "--accumulate", "2"],
                                   ["--clip-grad-norm", "0.5", "--ema", "0.9", "--mixup",
                                    "0.2", "--no-wd"]],
                         ids=["plain", "fp16-accumulate", "recipe"])
def test_replicas_stay_identical_and_factors_travel(tmp_path, extra):
    results, params, log = run_ranks(HVD, tmp_path, FLAGS + ["--epochs", "2"] + extra,
                                     env={"HVDTRAIN_DUMP_EPOCHS": "1"})
    assert "PowerSGD rank 4: 3 gradient matrices" in log, log[-3000:]
    # Bit-identical: every rank applies the same factors, BatchNorm's statistics averaged.
    assert_same_params(params[0], params[1])
    assert results[0]["test_acc"] == results[1]["test_acc"] > 0.5
    if "--clip-grad-norm" in extra:  # the factors' product is what is clipped, alike
        clipped = [int(n) for n in re.findall(r"\((\d+) steps clipped\)", log)]
        assert clipped and sum(clipped) > 0, log[-3000:]
    # Epoch 2 is compressed throughout: each step sends (as float32 arrays; float16 on the
    # wire halves them) the factors and the few small gradients, not the whole gradient.
    steps = 12 // (2 if "--accumulate" in extra else 1)
    sent = json.load(open(tmp_path / "rank0-exchanged.json"))["1"]
    whole = whole_gradient_bytes(params[0])
    assert sum(sent) / steps < whole / 10, (sum(sent) / steps, whole)
    assert 3 * steps <= len(sent)  # the whole bucket and P and Q each step


def test_resume_continues_powersgds_state(tmp_path):
    """Stopped at step 17 (inside epoch 2) with checkpoints every 5 steps (written in the
    background, each gathering the errors from every rank), then resumed: the same model
    as two epochs in one go, to rounding (the errors' sum is saved; each rank takes its
    share). The same resume with the state taken out of the checkpoint ends further away:
    the state is what matters."""
    flags = FLAGS + ["--powersgd-start-step", "0", "--epochs", "2"]
    straight = tmp_path / "straight"
    _, uninterrupted, _ = run_ranks(HVD, straight, flags + ["--output-dir",
                                                            str(straight / "run")])
    part = tmp_path / "part"
    run_ranks(HVD, part, flags + ["--max-steps", "17", "--checkpoint-every", "5steps",
                                  "--output-dir", str(part / "run")])
    saved = sorted(os.listdir(part / "run" / "checkpoints"))
    # Steps 5, 10, 15 (a save comes a step or two late while the write before it still
    # runs, as on a loaded machine) and the stop at 17, the newest three kept.
    assert len(saved) == 4 and saved[2:] == ["epoch-0001-step-0000017", "latest"], saved
    lost = tmp_path / "lost"
    shutil.copytree(part / "run", lost / "run")
    checkpoint = lost / "run" / "checkpoints" / "epoch-0001-step-0000017"
    (checkpoint / "powersgd.npz").unlink()
    meta = json.loads((checkpoint / "meta.json").read_text())
    meta["has_compression_state"] = False
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    resumed = {}
    for name, folder in (("resumed", part), ("lost", lost)):
        _, resumed[name], log = run_ranks(HVD, folder, flags + [
            "--output-dir", str(folder / "run"), "--resume", "auto"])
        assert "resumed from" in log, log[-3000:]
        assert_same_params(resumed[name][0], resumed[name][1])
    assert "holds no PowerSGD state: its errors start from zero" in log, log[-3000:]

    def apart(params):
        return max(float(np.max(np.abs(params[k] - uninterrupted[0][k]))) for k in params)
    for rank in (0, 1):
        assert_same_params(uninterrupted[rank], resumed["resumed"][rank], tol=1e-5)
    assert apart(resumed["lost"][0]) > 10 * apart(resumed["resumed"][0]), \
        (apart(resumed["lost"][0]), apart(resumed["resumed"][0]))
