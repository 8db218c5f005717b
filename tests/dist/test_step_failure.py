"""One rank's training step fails (its batch processor raises inside the Estimator's fit):
every rank stops at that step with the same line, naming the cause and the rank, and no
rank applies the step (issue 63, "Agree, then act": the step's verdict rides its counts).
Before, the failing rank left alone and mpirun's SIGTERM ended the other, which printed
that and not the cause. The three ways the counts travel: right after the gradients (the
default exchange), made before the step's last pass and sent after it (clipping), and with
the loss's divisors (a processor's ``loss_divisor``)."""
import os
import re
import sys

import numpy as np
import pytest

from helpers import run_command
from jobs import HERE, launcher

pytestmark = pytest.mark.dist
TAG = re.compile(r"\[1,\d+\]<std\w+>:")  # mpirun's tags, wherever they fall
PROGRAM = os.path.join(HERE, "step_failure_program.py")


@pytest.mark.parametrize("options", [[], ["clip_grad_norm=5"], ["divided"]],
                         ids=["default", "clipped", "divided"])
def test_a_step_failing_on_one_rank_stops_every_rank_with_its_cause(tmp_path, options):
    proc = run_command(launcher("ranks", 2) + [sys.executable, PROGRAM, str(tmp_path), "1"]
                       + options, timeout=90)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    lines = {rank: [TAG.sub("", l.split(">:", 1)[1]) for l in proc.stdout.splitlines()
                    if l.startswith(f"[1,{rank}]") and re.search(r"error|SIGTERM", l)]
             for rank in (0, 1)}
    want = ("step_failure_program.py: error: ValueError: batch 3 holds a label outside the "
            "model's range (rank 1; every rank stopped at train_step)")
    assert lines == {0: [want], 1: [want]}, lines
    kept = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in (0, 1)]
    for seen in kept:
        assert int(seen["ends"]) == 2  # two steps ended, the third stopped every rank
        names = [k[4:] for k in seen if k.startswith("now.")]
        assert names and all(np.array_equal(seen[f"now.{n}"], seen[f"before.{n}"])
                             for n in names)  # the failed step applied nowhere
        assert all(np.array_equal(seen[f"now.{n}"], kept[0][f"now.{n}"]) for n in names)
