"""ShardedTrainer's decisions taken by every rank alike (issue 63, findings 3 and 4)."""
import json
import os
import re
import sys

import pytest

from helpers import run_command
from jobs import HERE, launcher

pytestmark = pytest.mark.dist
TAG = re.compile(r"\[1,\d+\]<std\w+>:")  # mpirun's tags, wherever they fall
PROGRAM = os.path.join(HERE, "shard_agree_program.py")


def test_save_states_is_written_by_rank_0_alone(tmp_path):
    """``save_states`` gathers on every rank (a collective) and rank 0 alone writes: given
    each rank's own path, only rank 0's file exists, holding every parameter's state
    (before, every rank wrote, and on a shared folder N ranks truncated one file). At 3
    ranks the gathered state's bytes are the same on every rank (before, each rank pickled
    the update counts in the order it counted them: its own pieces first)."""
    proc = run_command(launcher("ranks", 3) + [sys.executable, PROGRAM, str(tmp_path),
                                               "save"], timeout=90)
    assert proc.returncode == 0, proc.stdout[-3000:]
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(3)]
    assert all(r["files"] == ["states-rank0"] for r in reports), reports
    assert reports[0]["states"] == 4  # two Dense layers: weight and bias each
    assert len({r["sha256"] for r in reports}) == 1, reports
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]


def test_a_stale_gradient_on_one_rank_stops_every_rank_with_the_same_line(tmp_path):
    """Rank 1 leaves a trained parameter without a gradient at one step: every rank stops
    there with the same line naming it (before, rank 1 raised alone and rank 0 waited in
    the all-to-all until Horovod's stall timeout)."""
    proc = run_command(launcher("ranks", 2) + [sys.executable, PROGRAM, str(tmp_path),
                                               "stale"], timeout=90)
    assert proc.returncode == 1, proc.stdout[-3000:]
    lines = [TAG.sub("", l.split(":", 1)[1]) for l in proc.stdout.splitlines()
             if "shard_agree_program.py: error:" in l]
    assert len(lines) == 2 and len(set(lines)) == 1, proc.stdout[-3000:]
    assert "has not been updated by backward since last `step`" in lines[0]
    assert "(rank 1; every rank stopped at shard_stale)" in lines[0]


def test_a_failed_save_on_one_of_three_ranks_stops_every_rank_with_the_same_line(tmp_path):
    """The fault switch fails rank 1 at ``shard_save`` (after the gather, where rank 0's
    write is agreed): each of 3 ranks stops there with the same line, and no file is half
    written (rank 0's is whole: the atomic write ran before the vote)."""
    env = dict(os.environ, HVDTRAIN_FAULT_AT="shard_save:1")
    proc = run_command(launcher("ranks", 3) + ["-x", "HVDTRAIN_FAULT_AT", sys.executable,
                                               PROGRAM, str(tmp_path), "save"],
                       timeout=90, env=env)
    assert proc.returncode == 1, proc.stdout[-3000:]
    lines = [TAG.sub("", l.split(":", 1)[1]) for l in proc.stdout.splitlines()
             if "shard_agree_program.py: error:" in l]
    assert len(lines) == 3 and len(set(lines)) == 1, proc.stdout[-3000:]
    assert lines[0].endswith("fault injected at shard_save on rank 1 (HVDTRAIN_FAULT_AT) "
                             "(rank 1; every rank stopped at shard_save)"), lines
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]
