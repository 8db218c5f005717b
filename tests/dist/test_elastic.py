"""Elastic training under Horovod's own driver: ``horovodrun --gloo --min-np 2 --max-np 4
--host-discovery-script``, four MXNet workers on two loopback hosts, hvdtrain's GluonState.

One rank ``kill -9``s itself mid-run (step 55, commits every 10 steps): the survivors must
roll back to the commit at step 50 (their parameters after the reset bit for bit those all
ranks committed at step 50 before the kill), agree after every reset, and finish on 2 ranks.
"""
import pytest

from elastic_spike import parse, run

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_a_killed_rank_costs_a_rollback_not_the_job(tmp_path):
    args = parse(["--scenario", "kill", "--state", "gluon", "--steps", "120",
                  "--kill-step", "55", "--commit-every", "10", "--gloo-timeout", "10",
                  "--timeout", "240"])
    result = run(args, str(tmp_path))
    log = (tmp_path / "horovodrun.log").read_text()[-4000:]
    assert result["exit"] == 0, (result, log)
    assert result["sizes"] == [2, 4], (result, log)
    assert sorted(result["done"]) == [(0, 2, 120), (1, 2, 120)], (result, log)
    [recovery] = result["recoveries"]
    assert recovery["resumed_at_step"] == 51 and recovery["size_after"] == 2, result
    assert recovery["training_again_after_s"] < 30, result
    assert result["rollbacks"] and all(r["step"] == 50 and r["matches_commit"]
                                       for r in result["rollbacks"]), result
    assert not result["digest_disagreements"], result


def test_a_host_joins_and_leaves_with_hvdtrains_store(tmp_path):
    """hvdtrain's BucketedTrainer on its HorovodKVStore: 2 ranks, a host joins (4 ranks) and
    leaves again (2). The joining workers must not make the trainer's first-step parameter
    broadcast alone (the spike hung there), and every rank agrees at every commit."""
    args = parse(["--scenario", "resize", "--state", "gluon", "--trainer", "hvdtrain",
                  "--steps", "200", "--grow-at", "40", "--shrink-at", "110",
                  "--timeout", "240"])
    result = run(args, str(tmp_path))
    log = (tmp_path / "horovodrun.log").read_text()[-4000:]
    assert result["exit"] == 0, (result, log)
    assert result["sizes"] == [2, 4], (result, log)
    assert [r["size_after"] for r in result["recoveries"]] == [4, 2], result
    assert sorted(result["done"]) == [(0, 2, 200), (1, 2, 200)], (result, log)
    assert not result["digest_disagreements"], result
