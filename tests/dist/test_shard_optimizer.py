"""``shard_optimizer=True`` (store/sharded.py) at 2 and 3 ranks: a tiny MLP trained by the
Estimator ends with the weights it ends with unsharded (SGD with momentum, NAG, Adam; with
per-parameter lr_mult/wd_mult; also with one rank's whole first step unusable), every rank
holding the same arrays, each rank holding the optimizer state of its slice alone
(tests/dist/shard_program.py runs every case in one job per world size)."""
import json
import os
import sys

import numpy as np
import pytest

from helpers import assert_arrays_close, run_command
from jobs import JOB_TIMEOUT, launcher

pytestmark = pytest.mark.dist
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shard_program.py")
OPTIMIZERS = ["sgd", "nag", "adam", "lamb"]
STATES_PER_ELEMENT = {"sgd": 1, "nag": 1, "adam": 2, "lamb": 2}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def job(request, tmp_path_factory):
    """(each rank's arrays, each rank's report) of one job of `ranks` ranks."""
    ranks = request.param
    out_dir = tmp_path_factory.mktemp(f"shard{ranks}")
    proc = run_command(launcher("ranks", ranks) + [sys.executable, SCRIPT, str(out_dir)],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    arrays = [dict(np.load(out_dir / f"rank{r}.npz")) for r in range(ranks)]
    reports = [json.load(open(out_dir / f"rank{r}.json")) for r in range(ranks)]
    assert [r["ranks"] for r in reports] == [ranks] * ranks
    return arrays, reports


def _case(arrays, optimizer, unusable, sharded):
    prefix = f"{optimizer}-{unusable}-{int(sharded)}:"
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


@pytest.mark.parametrize("unusable", [0, 1], ids=["all_usable", "one_rank_step_unusable"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_sharded_ends_with_the_unsharded_weights(job, optimizer, unusable):
    """Within 1e-6 per unit of magnitude. At 2 ranks bit for bit (a sum of two is the same in
    any order) but for LAMB, whose norms MXNet takes in its fused multi_lamb_update and the
    sharded update as sums of per-slice parts; at 3 the reduce-scatter adds the three
    ranks' gradients in another order than the allreduce (seen: up to 1.2e-7 apart)."""
    arrays, reports = job
    plain = _case(arrays[0], optimizer, unusable, False)
    sharded = _case(arrays[0], optimizer, unusable, True)
    assert plain and sorted(plain) == sorted(sharded)
    for name in plain:
        assert_arrays_close(sharded[name], plain[name], 1e-6, what=name)
    if len(arrays) == 2 and optimizer != "lamb":
        assert all(np.array_equal(sharded[n], plain[n]) for n in plain)
    start = {k[len("start:"):]: v for k, v in arrays[0].items() if k.startswith("start:")}
    assert all(not np.array_equal(start[n], plain[n]) for n in plain)  # it trained
    steps = {r["cases"][f"{optimizer}-{unusable}-{s}"]["steps"] for r in reports for s in (0, 1)}
    assert len(steps) == 1 and steps.pop() > 0  # every run took the same steps


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_rank_holds_the_same_weights(job, optimizer):
    arrays, _ = job
    for unusable in (0, 1):
        mine = _case(arrays[0], optimizer, unusable, True)
        for other in arrays[1:]:
            theirs = _case(other, optimizer, unusable, True)
            assert all(np.array_equal(mine[n], theirs[n]) for n in mine)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_each_rank_holds_the_state_of_its_slice(job, optimizer):
    """The slices of the ranks' states add up to one state of the model, split within one
    element per bucket of evenly."""
    _, reports = job
    ranks = len(reports)
    seen = [r["cases"][f"{optimizer}-0-1"] for r in reports]
    elements = seen[0]["elements"]
    held = [s["state_elements"] for s in seen]
    assert sum(held) == STATES_PER_ELEMENT[optimizer] * elements
    buckets = seen[0]["buckets"]
    assert buckets > 1  # slices cut inside parameters and span several
    for h in held:
        assert abs(h / STATES_PER_ELEMENT[optimizer] - elements / ranks) <= buckets
    assert all(s["state_bytes"] == 4 * s["state_elements"] for s in seen)


def test_a_bucket_smaller_than_the_ranks(job):
    """A bucket of one element (a Dense(1)'s bias, alone): some rank's slice of it is
    empty; it trains as unsharded too, alike on every rank."""
    arrays, reports = job
    plain, sharded = (_case(arrays[0], "tiny", 0, s) for s in (False, True))
    assert sorted(plain) == ["0.bias", "0.weight"] and plain["0.bias"].size == 1
    assert reports[0]["cases"]["tiny-0-1"]["buckets"] == 2
    for name in plain:
        assert_arrays_close(sharded[name], plain[name], 1e-6, what=name)
        assert not np.array_equal(plain[name], arrays[0][f"start-tiny:{name}"])
    for other in arrays[1:]:
        theirs = _case(other, "tiny", 0, True)
        assert all(np.array_equal(sharded[n], theirs[n]) for n in sharded)
