"""Losses that divide their own gradient by a count of the batch, trained by hvdtrain's
Estimator on 2 and 3 ranks (loss_divisors_program.py), against one process over the global
batch: a plain Gluon loop written here, ``trainer.step(global batch)`` after one backward
pass over the whole batch, as MXNet's Estimator steps in one process. GluonCV's
SoftmaxCrossEntropyLoss (default), MixSoftmaxCrossEntropyLoss(aux=True) (with clipping by
the global norm too) and SSDMultiBoxLoss (with accumulate=2 too), ignored pixels and
positives spread unevenly, the last rank's first micro-batch without any object: the weights
agree to 1e-6 and every array is identical on every rank. Processors counting their batches
in objects and in tokens train as one process dividing by the global count, and
metrics.jsonl counts the unusable samples, not positions less objects. One job per world
size serves every scenario."""
import json
import os
import sys

import numpy as np
import pytest

from helpers import assert_arrays_close, run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

import loss_divisors_program as program  # noqa: E402

pytestmark = pytest.mark.dist
PROGRAM = os.path.join(HERE, "loss_divisors_program.py")
TOLERANCE = 1e-6  # per unit of magnitude: the ranks add their sums in another order


@pytest.fixture(scope="module", params=[2, 3])
def job(request, tmp_path_factory):
    """(ranks, the output folder, every rank's errors) of one job running every scenario."""
    ranks = request.param
    out = tmp_path_factory.mktemp(f"divisors{ranks}")
    proc = run_command(launcher("ranks", ranks) + [sys.executable, PROGRAM, str(out)],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    errors = [json.load(open(out / f"rank{r}.json")) for r in range(ranks)]
    return ranks, out, errors


@pytest.mark.parametrize("scenario", ["seg", "mix", "mix_clip", "ssd", "ssd_accumulate",
                                      "objects", "tokens"])
def test_a_step_on_n_ranks_is_one_process_step_over_the_global_batch(job, scenario):
    ranks, out, errors = job
    assert all(scenario not in e for e in errors), errors
    start = dict(np.load(out / f"start-{scenario}.npz"))
    got = [dict(np.load(out / f"rank{r}-{scenario}.npz")) for r in range(ranks)]
    for rank in range(1, ranks):
        assert_same_params(got[0], got[rank])  # bit-identical on every rank
    want = program.reference(scenario, ranks, start)
    ratios = []
    for name, value in want.items():
        assert_arrays_close(got[0][name], value, TOLERANCE, what=f"{scenario} {name}")
        moved = np.abs(value - start[name]) > 1e-4
        ratios += list(((got[0][name] - start[name]) / (value - start[name]))[moved])
    print(f"{scenario} at {ranks} ranks: update / one process's, per element: "
          f"{min(ratios):.6f} .. {max(ratios):.6f}")


@pytest.mark.parametrize("scenario", ["objects", "tokens"])
def test_a_count_of_objects_or_tokens_leaves_the_unusable_count_alone(job, scenario):
    ranks, out, _ = job
    records = [json.loads(line) for line in open(out / f"{scenario}-run" / "metrics.jsonl")]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(epochs) == 1, records
    assert epochs[-1]["skipped_train_samples"] == len(program.BAD), epochs[-1]
