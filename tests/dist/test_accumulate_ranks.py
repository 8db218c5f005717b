"""--accumulate on two Horovod ranks: the exchange of summed micro-batch gradients, against
an independent reference (tests/plain_gluon.py: a plain Gluon Trainer, kvstore=None, in this
process, on the global batch)."""
import numpy as np
import pytest

from jobs import DIGITS, assert_same_params, launcher, run_ranks
from plain_gluon import global_batches, train_plain
from hvdtrain.data.datasets import load_digits

pytestmark = pytest.mark.dist

SEED, LR, STEPS = 42, 0.1, 10


def test_two_ranks_accumulating_match_one_process_with_the_whole_batch(tmp_path):
    """2 ranks x 4 micro-batches of 8 against one plain Gluon Trainer stepping once per
    batch of 64 (no accumulation, no store): with strided sampling step k of both ranks
    holds positions 64k .. 64k+63 of the epoch's (seed, epoch) order. 10 steps stay clear
    of the epoch's end, where the two ranks' padding adds a sample the single process does
    not have."""
    flags = DIGITS + ["--sampling", "strided", "--max-steps", str(STEPS), "--lr", str(LR),
                      "--model", "mlp", "--seed", str(SEED), "--batch-size", "8",
                      "--accumulate", "4"]
    results, two, _ = run_ranks(launcher("ranks"), tmp_path, flags,
                                env={"HVDTRAIN_DUMP_START": "1"})
    assert [r["steps"] for r in results] == [STEPS, STEPS], results
    start = [dict(np.load(tmp_path / f"rank{rank}-start.npz")) for rank in (0, 1)]
    assert_same_params(start[0], start[1])  # broadcast before the first step
    assert_same_params(two[0], two[1])
    data = load_digits()
    steps = global_batches(len(data.train_y), SEED, 64, max_steps=STEPS)
    reference, _ = train_plain("mlp", start[0], data.train_x, data.train_y, steps, LR)
    # Sums of the same per-sample gradients in another order (8 per micro-batch, 4
    # micro-batches, 2 ranks against 64 at once): equal up to rounding.
    assert_same_params(two[0], reference, tol=1e-5)
