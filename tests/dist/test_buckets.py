"""Zero-copy gradient buckets keep Gluon's Trainer contract at 2 ranks: whatever is done to
the parameters, a net trained with a BucketedTrainer ends where an independently built copy
trained by Gluon's own Trainer over the same store ends, and both ranks agree
(tests/dist/bucket_cases.py runs the cases)."""
import json
import os
import sys

import numpy as np
import pytest

from helpers import run_command
from jobs import JOB_TIMEOUT, launcher

pytestmark = pytest.mark.dist
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bucket_cases.py")
CASES = ["backward_before_setup", "setup_first", "unfreeze", "freeze", "grad_add",
         "reset_ctx", "cast", "load_parameters", "two_devices"]
MODES = ["imperative", "hybridize", "static"]


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """Both ranks' reports of every case, from one 2-rank run."""
    out_dir = tmp_path_factory.mktemp("buckets")
    proc = run_command(launcher("ranks") + [sys.executable, SCRIPT, str(out_dir)] + CASES,
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return [json.load(open(out_dir / f"buckets{rank}.json")) for rank in (0, 1)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_buckets_train_as_gluons_trainer(seen, case, mode):
    reports = [dump["cases"][f"{case}/{mode}"] for dump in seen]
    assert [dump["num_workers"] for dump in seen] == [2, 2]
    assert all(report["buckets"] > 1 for report in reports), [r["buckets"] for r in reports]

    def ranks_part(key):
        return float(np.max(np.abs(np.subtract(reports[0][key], reports[1][key]))))

    # The same sums of the same float32 gradients in the same order: the two nets agree to
    # rounding (float64 after `cast`). Each rank fed batches of its own, so a gradient left
    # out of the exchange would also part the ranks. All figures are reported at once: a
    # second plain net agreeing with the first says the buckets are at fault, and whether
    # a net's ranks part says where a difference began (a gradient wrong before the
    # exchange leaves both ranks agreeing on a wrong sum).
    seen_figures = {"bucketed_vs_plain": [(r["max_diff"], r["worst"]) for r in reports],
                    "plain_vs_plain_again": [r["plain_twice_diff"] for r in reports],
                    "largest_value": [r["largest"] for r in reports],
                    "bucketed_ranks_part": ranks_part("params"),
                    "plain_ranks_part": ranks_part("plain_params")}
    assert (all(r["max_diff"] <= 1e-6 and r["plain_twice_diff"] <= 1e-6 for r in reports)
            and seen_figures["bucketed_ranks_part"] <= 1e-6
            and seen_figures["plain_ranks_part"] <= 1e-6), (case, mode, seen_figures)
    assert reports[0]["params"] != pytest.approx(0.0)
    # Re-created gradients are re-planned; those left alone are not.
    recreated = case in ("unfreeze", "freeze", "grad_add", "reset_ctx", "cast")
    assert all((r["replans"] > 0) == recreated for r in reports), reports[0]["replans"]


@pytest.mark.parametrize("mode", MODES)
def test_buckets_set_up_before_backward_copy_nothing(seen, mode):
    """hvdtrain sets the store up before the first forward pass: then backward writes every
    gradient into its bucket, static_alloc graphs included."""
    assert [dump["cases"][f"setup_first/{mode}"]["copied"] for dump in seen] == [0, 0]
