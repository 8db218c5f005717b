"""--accumulate on two Horovod ranks: the exchange of summed micro-batch gradients."""
import pytest

from jobs import DIGITS, assert_same_params, launcher, run_ranks

pytestmark = pytest.mark.dist


def test_two_ranks_accumulating_match_one_process_with_the_whole_batch(tmp_path):
    """2 ranks x 4 micro-batches of 8 against one process with batch 64 (plain, no
    accumulation): with strided sampling step k of both holds positions 64k .. 64k+63 of
    the epoch's order. 10 steps stay clear of the epoch's end, where the two ranks' padding
    adds a sample the single process does not have."""
    flags = DIGITS + ["--sampling", "strided", "--max-steps", "10", "--lr", "0.1",
                      "--model", "mlp"]
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    results, two, _ = run_ranks(launcher("horovodrun-gloo"), tmp_path / "two",
                                flags + ["--batch-size", "8", "--accumulate", "4"])
    _, one, _ = run_ranks([], tmp_path / "one", flags + ["--batch-size", "64"])
    assert [r["steps"] for r in results] == [10, 10], results
    assert_same_params(two[0], two[1])
    # Sums of the same per-sample gradients in another order: equal up to rounding.
    assert_same_params(two[0], one[0], tol=1e-5)
