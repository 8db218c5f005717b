"""A slow rank is not a dead rank: a pause of minutes on rank 0 (slow storage, an
evaluation alone) ends neither a user's own program nor an hvdtrain job. (A frozen rank
still ends the job: test_reliability.py's test_a_frozen_rank_ends_the_job.)"""
import json
import os
import pathlib

import pytest

from paused_jobs import GLOO_AND_MPI, PAUSE_S

pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.mark.parametrize("name", GLOO_AND_MPI)
def test_a_library_program_whose_rank_0_pauses_200_s_finishes(name, paused_jobs):
    """README's library API (`import hvdtrain; mx.kv.create('horovod')`): the store sets no
    stall shutdown of its own, so a 200 s pause between two pushpulls is only slow (under
    Gloo too: Horovod's background threads keep exchanging while rank 0 pauses)."""
    proc, _ = paused_jobs.finish(("library", name))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"rank 0 pauses {PAUSE_S} s" in proc.stdout
    # ones * (rank + 1) summed over ranks 0 and 1, before and after the pause
    assert "rank 0 sums 3 3" in proc.stdout and "rank 1 sums 3 3" in proc.stdout


@pytest.mark.parametrize("name", GLOO_AND_MPI)
def test_a_checkpoint_slower_than_the_stall_timeout_is_not_a_stall(name, paused_jobs):
    """--stall-timeout 60, rank 0's first checkpoint takes 150 s more: rank 0 is busy, rank
    1 waits in the next allreduce hearing that through the pulse; the run finishes in one
    go (nothing resumed) with every step and checkpoint."""
    proc, run_root = paused_jobs.finish(("checkpoint", name))
    tmp_path = pathlib.Path(run_root)
    out = tmp_path / "run"
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "slow storage: this checkpoint takes 150 s more" in proc.stdout
    assert "no progress on any rank" not in proc.stdout and "resumed" not in proc.stdout
    results = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert [r["steps"] for r in results] == [2 * 23, 2 * 23]  # 1437 digits, global batch 64
    assert sorted(os.listdir(out / "checkpoints")) == ["epoch-0001", "epoch-0002", "latest"]
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["start", "epoch", "epoch", "end"]
