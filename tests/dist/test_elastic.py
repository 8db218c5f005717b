"""Elastic training under Horovod's own driver: ``horovodrun --gloo --min-np 2 --max-np 4
--host-discovery-script``, four MXNet workers on two loopback hosts.

The spike's worker on hvdtrain's GluonState: one rank ``kill -9``s itself mid-run (step 55,
commits every 10 steps): the survivors must roll back to the commit at step 50 (their
parameters after the reset bit for bit those all ranks committed at step 50 before the
kill), agree after every reset, and finish on 2 ranks. Then ``hvdtrain --elastic`` itself.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from elastic_commits import records as commit_records
from elastic_ids import trained_ids
from elastic_job import parse as parse_job, run as run_job
from elastic_spike import parse, run
from helpers import record_job, tool
from hvdtrain.state.checkpoint_files import changed_files, is_complete, read_meta

HERE = os.path.dirname(os.path.abspath(__file__))

# `alone`: these jobs set Gloo's timeout to 10 s (a fast recovery). Beside the other test
# process (a load of 7 on 2 cores) a returning host's workers once started too slowly to
# meet it, and the running workers aborted (docs/elastic.md, HOROVOD_GLOO_TIMEOUT_SECONDS).
# `make test` runs these tests after the others, two at a time (they leave half the cores
# idle alone: 54% on 2026-12-05); the one test whose host returns gives its joining workers
# 20 s, for a start-up beside another elastic job.
pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.alone]

# A worker's line per step (the spike's step and commit events, hvdtrain's progress lines):
# left out of the failure report, so that each process's last words are in it.
ROUTINE = re.compile(r'"event": "(step|commit)"| step \d+/\d+  loss ')


def _report_on_failure(driver, flags, folder):
    """Have a failure of this test show the job's output (tests/conftest.py). Messages stay
    short strings: pytest cuts any other object in an assertion message to 240 characters,
    which left stop 34's failure of the kill job unexplained."""
    record_job([driver] + flags, path=os.path.join(str(folder), "horovodrun.log"),
               routine=ROUTINE)


def _brief(result):
    """The summary of an elastic run as one string, without its long event lists."""
    return json.dumps({k: v for k, v in result.items() if k not in ("metrics", "syncs")},
                      default=str)[:3000]


def _killing_job(tmp_path, name, flags_for):
    """Run elastic_job.py with the flags `flags_for(folder)` gives, in tmp_path / name; return
    its result and folder. A run in which Gloo aborted a surviving worker as its peer was
    killed (Horovod 0.28.1's own race, docs/elastic.md "A survivor that Gloo aborts": seen
    twice by 2026-12-07) is run once more in a folder of its own, and the test says so; any other failure, or that abort twice, fails the test."""
    for attempt in (1, 2):
        folder = tmp_path / (name if attempt == 1 else name + "-again")
        flags = flags_for(folder)
        _report_on_failure("elastic_job.py", flags, folder)
        result = run_job(parse_job(flags), str(folder))
        if result["exit"] == 0 or not result["gloo_aborted_a_survivor"]:
            break
        print("Gloo aborted a surviving worker as its peer was killed (Horovod 0.28.1's "
              "race, docs/elastic.md): the job once more")
    return result, folder


def _finished_on_two_ranks(tmp_path, flags, steps):
    """Run the spike driver with `flags`; check the job trained at 4 ranks and at 2, and
    ended with exit 0 on 2 ranks that trained `steps` steps; return its result."""
    flags = flags + ["--state", "gluon", "--steps", str(steps), "--timeout", "240"]
    _report_on_failure("elastic_spike.py", flags, tmp_path)
    result = run(parse(flags), str(tmp_path))
    assert result["exit"] == 0, _brief(result)
    assert result["sizes"] == [2, 4], _brief(result)
    assert sorted(result["done"]) == [(0, 2, steps), (1, 2, steps)], _brief(result)
    return result


def test_a_killed_rank_costs_a_rollback_not_the_job(tmp_path):
    result = _finished_on_two_ranks(tmp_path, ["--scenario", "kill", "--kill-step", "55",
                                               "--commit-every", "10", "--gloo-timeout", "10"],
                                    120)
    [recovery] = result["recoveries"]
    assert recovery["resumed_at_step"] == 51 and recovery["size_after"] == 2, _brief(result)
    # How long the reset took is a figure (docs/elastic.md), not an assertion: on a busy
    # machine it has no bound this test could keep.
    print(f"training again {recovery['training_again_after_s']:.1f} s after the kill")
    assert result["rollbacks"] and all(r["step"] == 50 and r["matches_commit"]
                                       for r in result["rollbacks"]), _brief(result)
    assert not result["digest_disagreements"], _brief(result)


@pytest.mark.parametrize("scenario", ["kill", "resize"])
def test_a_sharded_optimizer_state_is_cut_again_for_the_ranks_after_a_reset(scenario,
                                                                          tmp_path):
    """hvdtrain's ShardedTrainer (``shard_optimizer``: Adam's state in slices of 2 buckets
    over the ranks) under the spike's driver. `kill`: a rank of 4 is killed at step 35;
    every commit gathered the whole state, so the survivors restore it, although a quarter
    of it was on the rank killed, and cut it in halves for the 2 ranks there are then.
    `resize`: 2 ranks grow to 4 (the joining workers take their quarters of rank 0's
    whole state), then a host leaves, and Horovod resets without a sync: the survivors cut
    the state their last commit gathered. Either way the final weights equal a plain Gluon
    loop in one process that trains each step on the batches of that step's ranks (the
    job's own record of its world sizes), to 1e-5; every rank agrees after every sync."""
    folder = tmp_path / "job"
    folder.mkdir()
    weights = str(tmp_path / "elastic.npz")
    steps, events = {"kill": (80, ["--kill-step", "35"]),
                     "resize": (90, ["--grow-at", "20", "--shrink-at", "50"])}[scenario]
    flags = ["--scenario", scenario, *events, "--state", "gluon", "--commit-every", "10",
             "--gloo-timeout",
             "10", "--trainer", "sharded", "--bucket-mb", "0.004", "--optimizer", "adam",
             "--weights-out", weights, "--steps", str(steps), "--timeout", "240"]
    _report_on_failure("elastic_spike.py", flags, folder)
    result = run(parse(flags), str(folder))
    assert result["exit"] == 0, _brief(result)
    assert not result["digest_disagreements"], _brief(result)
    sizes = result["step_sizes"]
    if scenario == "kill":
        assert result["rollbacks"] and all(r["step"] == 30 and r["matches_commit"]
                                           for r in result["rollbacks"]), _brief(result)
        assert sizes == [4] * 30 + [2] * 50, sizes
    else:
        changes = [size for i, size in enumerate(sizes) if i == 0 or size != sizes[i - 1]]
        assert changes == [2, 4, 2] and len(sizes) == steps, sizes
    schedule = tmp_path / "sizes.json"
    schedule.write_text(json.dumps(sizes))
    reference = str(tmp_path / "reference.npz")
    subprocess.run([sys.executable, os.path.join(HERE, "elastic_program.py"), "--reference",
                    str(schedule), "--optimizer", "adam", "--weights-out", reference],
                   check=True, timeout=120)
    got, want = np.load(weights), np.load(reference)
    assert sorted(got.files) == sorted(want.files) and len(got.files) == 4
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want.files)
    print(f"{scenario}: world sizes {changes if scenario == 'resize' else '4, 2'}; largest "
          f"difference from the one-process reference {worst:.2e}")
    for name in want.files:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


# A host joining and leaving a job that trains with hvdtrain's BucketedTrainer on its
# HorovodKVStore (the joining workers must not make the trainer's first-step broadcast alone):
# test_hvdtrain_elastic_loses_a_host_gets_it_back_and_survives_a_kill, where 127.0.0.3 leaves
# and comes back to `hvdtrain --elastic` itself.


# --- hvdtrain --elastic itself (tests/dist/elastic_job.py) ----------------------------------


# 6 epochs of digits, batch 8 per worker, the rate decayed for the last; --lr-scaling linear:
# the rate follows the world size, as the global batch does.
JOB = ["--epochs", "6", "--", "--lr-decay-epochs", "5", "--lr-scaling", "linear",
       "--lr", "0.0125"]


def _one_digest_per_sync(result):
    seen = {}
    for sync in result["syncs"]:
        seen.setdefault((sync["step"], sync["size"]), set()).add(sync["digest"])
    return seen


def test_hvdtrain_elastic_loses_a_host_gets_it_back_and_survives_a_kill(tmp_path):
    """4 ranks on two loopback hosts. 127.0.0.3 leaves the discovery output in epoch 2 (the
    job goes on with 2), returns in epoch 3 (back to 4 at the next commit), and in epoch 4
    one of its workers is killed with SIGKILL (the job goes on with 2). All six epochs
    finish; after every reset every rank holds the same arrays; every training sample is
    trained once per epoch (resizes included, rolled-back steps excluded); the final
    accuracy is that of the same job run plainly, never disturbed, within 0.01."""
    def flags_for(folder):
        return ["--leave", "2:10", "--back", "3:10", "--kill", "4:20",
                "--record", str(folder) + "-ids", "--gloo-timeout", "20",
                "--timeout", "240"] + JOB

    result, folder = _killing_job(tmp_path, "elastic", flags_for)
    record = str(folder) + "-ids"
    assert result["exit"] == 0, _brief(result)
    resets = [(m["previous_num_workers"], m["num_workers"]) for m in result["metrics"]
              if m["event"] == "elastic"]
    assert resets == [(None, 4), (4, 2), (2, 4), (4, 2)], resets
    epochs = [m["epoch"] for m in result["metrics"] if m["event"] == "epoch"]
    assert epochs == list(range(6)), epochs
    syncs = _one_digest_per_sync(result)
    assert [size for _, size in syncs] == ["4", "2", "4", "2"], syncs
    assert all(len(digests) == 1 for digests in syncs.values()), syncs
    kill = next(e for e in result["events"] if e["name"] == "kill")
    # A figure for docs/elastic.md, not an assertion: it is the Gloo timeout (20 s here)
    # plus the reset, and a loaded machine has no bound this test could keep.
    print(f"training again {kill['training_again_after_s']} s after the kill")

    trained = trained_ids(record)
    num_train = 1437  # digits' training split
    for epoch in range(6):
        counts = trained[epoch]
        assert set(counts) == set(range(num_train)), (epoch, num_train - len(counts))
        # An epoch's last step wraps around to give every rank a full part: at most
        # workers - 1 samples twice, as in any epoch of any run.
        assert sum(counts.values()) - num_train <= 3, (epoch, counts.most_common(5))

    # The checkpoints stay resumable: one more epoch, one process, from the elastic folder.
    assert _resumes_alone(folder / "out", epochs=7) == 6

    flags = ["--plain", "--timeout", "200"] + JOB
    _report_on_failure("elastic_job.py", flags, tmp_path / "plain")
    plain = run_job(parse_job(flags), str(tmp_path / "plain"))
    assert plain["exit"] == 0, _brief(plain)
    final = [m["test_acc"] for r in (result, plain) for m in r["metrics"]
             if m["event"] == "end"]
    print(f"final test accuracy: elastic {final[0]:.4f}, plain {final[1]:.4f}")
    assert abs(final[0] - final[1]) <= 0.01, final


@pytest.mark.parametrize("event", ["sigterm", "vanish"])
def test_hvdtrain_elastic_ends_cleanly_on_sigterm_or_no_host(event, tmp_path):
    """SIGTERM to horovodrun in epoch 2, or the discovery output emptied there (the driver
    gives up after --elastic-timeout 10): horovodrun exits non-zero, every worker then
    exits by itself (within elastic_job.LEFTOVER_BOUND_S: a bound, not a measurement), and
    the folder resumes (one more epoch, one process). How soon horovodrun ended and its
    workers were gone is printed, not asserted (docs/elastic.md has the figures)."""
    flags = [f"--{event}", "2:10", "--elastic-timeout", "10", "--timeout", "180", "--epochs",
             "4"]
    _report_on_failure("elastic_job.py", flags, tmp_path / "job")
    result = run_job(parse_job(flags), str(tmp_path / "job"))
    assert result["exit"] not in (0, "timeout"), _brief(result)
    assert result["alive_after_exit"] == 0, _brief(result)
    [happened] = result["events"]
    print(f"{event}: horovodrun ended {happened['launcher_exit_after_s']} s later, its "
          f"last worker {result['workers_gone_after_s']} s after that")
    assert _resumes_alone(tmp_path / "job" / "out", epochs=4) >= 1


def _resumes_alone(out, epochs):
    """Resume the folder `out` of an elastic job with one process (not elastic) to `epochs`
    epochs; check it resumed and finished; return the epoch it started from."""
    more = subprocess.run([tool("hvdtrain"), "--dataset", "digits", "--no-cuda",
                           "--batch-size", "8", "--epochs", str(epochs), "--output-dir",
                           str(out), "--resume", "auto", "--log-interval", "0"],
                          capture_output=True, text=True, timeout=120)
    assert more.returncode == 0, more.stderr[-2000:]
    assert "resumed from" in more.stderr, more.stderr[-2000:]
    starts = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"start"' in line]
    return starts[-1]["start_epoch"]


def test_a_users_model_through_the_estimator_survives_the_kill_of_a_rank(tmp_path):
    """examples/regression.py's model and data through hvdtrain.Estimator(elastic=True)
    (tests/dist/estimator_elastic.py), 4 ranks on two loopback hosts: a worker of
    127.0.0.3 is killed with SIGKILL in epoch 2, the job goes on with 2 ranks and finishes
    its 3 epochs; after the reset every rank holds the same arrays, and the model learnt
    (its validation RMSE well below the targets' spread, 0.86)."""
    result, _ = _killing_job(tmp_path, "job", lambda folder: [
        "--program", "estimator", "--kill", "2:10", "--timeout", "240", "--epochs", "3"])
    assert result["exit"] == 0, _brief(result)
    resets = [(m["previous_num_workers"], m["num_workers"]) for m in result["metrics"]
              if m["event"] == "elastic"]
    assert resets == [(None, 4), (4, 2)], resets
    assert [m["epoch"] for m in result["metrics"] if m["event"] == "epoch"] == [0, 1, 2]
    syncs = _one_digest_per_sync(result)
    assert [size for _, size in syncs] == ["4", "2"], syncs
    assert all(len(digests) == 1 for digests in syncs.values()), syncs
    [end] = [m for m in result["metrics"] if m["event"] == "end"]
    assert end["val_rmse"] < 0.5, end


# One worker on each of three loopback hosts: Horovod's driver blacklists a failed worker's
# host, which must leave the --min-np 2 others.
THREE_HOSTS = "127.0.0.2:1,127.0.0.3:1,127.0.0.4:1"
STALL_S = 20  # the fault test's --stall-timeout; its bound is this plus 30 s (issue 63)


def test_a_rank_failing_inside_a_sharded_commit_leaves_the_others_the_last_whole_commit(
        tmp_path):
    """The fault test of ``elastic.commit`` (tests/dist/test_agree_faults.py lists it here):
    ``hvdtrain --elastic --shard-optimizer``, 3 ranks, a commit every 5 steps (60 steps an
    epoch at 3 ranks). Rank 2 fails at its 15th commit (epoch 2, step 70) through the fault
    switch, between the commit's copy of the weights and its gather of the sharded optimizer
    state, which the two others have entered. That is a program error, not a failed
    collective: Horovod's run_fn does not roll that worker back, so it prints one line and
    exits 1, and the driver takes its exit for a lost worker (its host blacklisted). The
    others' gather then fails, they restore their last whole commit (step 65: its weights
    and optimizer state as they recorded them when it was made, never step 70's weights
    beside step 65's optimizer state), are training again at 2 ranks within the stall bound
    and end at --max-steps 80. One line names the cause, no rank prints a traceback, and
    every checkpoint written before the fault (epoch 1's, step 60) is whole beside the last."""
    result, folder = _killing_job(tmp_path, "fault", lambda folder: [
        "--hosts", THREE_HOSTS, "--fault", "elastic.commit:2:15", "--epochs", "2",
        "--commits", str(folder) + "-commits", "--timeout", "240", "--",
        "--shard-optimizer", "--stall-timeout", str(STALL_S), "--max-steps", "80"])
    assert result["exit"] == 0, _brief(result)
    cause = "hvdtrain: error: fault injected at elastic.commit on rank 2 (HVDTRAIN_FAULT_AT)"
    assert [line.endswith(cause) for line in result["fault_lines"]] == [True], _brief(result)
    assert result["tracebacks"] == 0, _brief(result)
    resets = [(m["previous_num_workers"], m["num_workers"]) for m in result["metrics"]
              if m["event"] == "elastic"]
    assert resets == [(None, 3), (3, 2)], resets
    [fault] = [e for e in result["events"] if e["name"] == "fault"]
    print(f"training again at 2 ranks {fault['training_again_after_s']} s after the fault")
    assert fault["training_again_after_s"] is not None, _brief(result)
    assert fault["training_again_after_s"] < STALL_S + 30, _brief(result)

    # Each survivor's restore is its last commit whole: weights, optimizer state, position.
    whole = ("epoch", "step", "arrays", "optimizer")
    records = commit_records(str(folder) + "-commits")
    restored = {}
    for pid, done in records.items():
        back = [n for n, r in enumerate(done) if r["event"] == "restored"]
        if back:
            last = [r for r in done[:back[0]] if r["event"] == "commit"][-1]
            restored[pid] = {k: done[back[0]][k] for k in whole}
            assert restored[pid] == {k: last[k] for k in whole}, (done[back[0]], last)
    assert len(records) == 3 and len(restored) == 2, records
    # The same commit on both (the optimizer's bytes are each rank's own: pickle keeps the
    # order in which that rank's update counts were first set, not the same on every rank).
    [(epoch, step, arrays)] = {(r["epoch"], r["step"], r["arrays"]) for r in restored.values()}
    assert (epoch, step) == (1, 65), restored
    [failed] = [done for pid, done in records.items() if pid not in restored]
    assert [r["step"] for r in failed if r["event"] == "commit"][-1] == 65, failed
    # ... and rank 0's, every rank's after the sync (the digest each rank logs).
    synced = {(s["step"], s["digest"]) for s in result["syncs"] if s["size"] == "2"}
    assert synced == {("65", arrays)}, (synced, restored)

    checkpoints = folder / "out" / "checkpoints"
    names = sorted(n for n in os.listdir(checkpoints) if n.startswith("epoch-"))
    for name in names:
        path = str(checkpoints / name)
        assert is_complete(path) and not changed_files(path, read_meta(path)), name
    assert (checkpoints / "latest").read_text().strip() in names
    steps = sorted(int(read_meta(str(checkpoints / n))["step"]) for n in names)
    assert steps[0] == 60 and steps[-1] == 80, steps
