"""What a resume and a fresh run refuse, warn about and change, through the `hvdtrain` command.

Every refusal is one line with exit status 2 and leaves the output folder byte-identical.
One process, no store (``--kvstore none``): a digits epoch takes well under a second.

Refusals run in this process (``cli.main``): a new one would spend seconds importing MXNet
to refuse. test_resume_with_other_model_dataset_and_optimizer_is_refused and the second run
of test_two_runs_at_once_the_second_is_refused_and_the_first_finishes are real processes:
they check that the whole process prints that one line and nothing else.
"""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from helpers import folder_digest, main_in_process, run_command, tool
from hvdtrain.state.checkpoint_files import CheckpointError
from hvdtrain.cli import parse_config
from hvdtrain.job import train
from hvdtrain.report.plot import main as plot_main

QUICK = ["--dataset", "digits", "--no-cuda", "--kvstore", "none", "--log-interval", "0"]


def hvdtrain(*flags):
    return run_command([tool("hvdtrain"), *QUICK, *flags], timeout=180)


def in_process(capfd, *flags):
    """`hvdtrain` with these flags run by ``cli.main`` here: (exit status, its lines)."""
    return main_in_process([*QUICK, *flags], capfd)


def outcome(proc):
    """A finished process's (exit status, non-empty lines), as :func:`in_process` gives."""
    return proc.returncode, [l for l in proc.stdout.splitlines() if l.strip()]


def assert_refused(result, *needles):
    code, lines = result
    assert code == 2 and len(lines) == 1, lines[-40:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_resume_with_other_model_dataset_and_optimizer_is_refused(run_copy):
    before = folder_digest(run_copy)
    proc = hvdtrain("--epochs", "3", "--output-dir", str(run_copy), "--resume", "auto",
                    "--dataset", "synthetic", "--model", "mlp", "--optimizer", "adam")
    assert_refused(outcome(proc), "--model mlp (checkpoint: simple_cnn)",
                   "--dataset synthetic (checkpoint: digits)",
                   "--optimizer adam (checkpoint: sgd)")
    assert folder_digest(run_copy) == before


def test_resume_with_other_dtype_is_refused(two_epochs):
    """--dtype float16 needs a GPU to run, so this checks the rule itself."""
    from hvdtrain.state.resume import check_compatible  # pylint: disable=import-outside-toplevel
    path = str(two_epochs / "checkpoints" / "epoch-0002")
    meta = json.load(open(os.path.join(path, "meta.json")))
    with pytest.raises(CheckpointError, match=r"--dtype float16 \(checkpoint: float32\)"):
        check_compatible(path, meta, parse_config(QUICK[:2] + ["--dtype", "float16",
                                                                "--epochs", "3"]))


def test_changed_flags_take_effect_in_the_loaded_optimizer(run_copy, capsys):
    run = train(parse_config(QUICK + ["--epochs", "3", "--output-dir", str(run_copy),
                                      "--resume", "auto", "--momentum", "0.5", "--wd", "0.1",
                                      "--lr", "0.2", "--batch-size", "32"]))
    optimizer = run.trainer._optimizer  # pylint: disable=protected-access
    assert (optimizer.momentum, optimizer.wd, optimizer.lr) == (0.5, 0.1, 0.2)
    err = capsys.readouterr().err
    changes = [l for l in err.splitlines() if "resume changes:" in l]
    assert len(changes) == 1 and " INFO " in changes[0]
    for change in ("--epochs 2 -> 3", "--lr 0.01 -> 0.2", "--momentum 0.9 -> 0.5",
                   "--wd 0.0001 -> 0.1", "--batch-size 64 -> 32"):
        assert change in changes[0], changes[0]
    assert "global batch of 32 instead of 64 (1 worker x 32 instead of 1 x 64)" in err
    assert run.result["steps"] == 2 * 23 + 45


def test_fresh_run_into_a_folder_with_checkpoints_is_refused(run_copy, capfd):
    before = folder_digest(run_copy)
    result = in_process(capfd, "--epochs", "3", "--output-dir", str(run_copy))
    assert_refused(result, "already holds checkpoints", "epoch-0002", "--resume auto",
                   "another --output-dir")
    assert folder_digest(run_copy) == before


def _edit_meta(path, **changes):
    meta = json.load(open(path / "meta.json"))
    meta.update(changes)
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("changes,needle", [
    (dict(epoch=-5), "epoch is -5, not a whole number >= 0"),
    (dict(step=-1000), "step is -1000, not a whole number >= 0"),
    (dict(epoch=100), "do not match the folder name"),
    (dict(has_states="yes"), "has_states is 'yes'"),
])
def test_invalid_metadata_is_refused(run_copy, changes, needle, capfd):
    only = run_copy / "checkpoints" / "epoch-0002"
    shutil.rmtree(run_copy / "checkpoints" / "epoch-0001")
    _edit_meta(only, **changes)
    before = folder_digest(run_copy)
    for resume in ("auto", str(only)):
        result = in_process(capfd, "--epochs", "6", "--output-dir", str(run_copy),
                            "--resume", resume)
        assert_refused(result, needle, *(["no usable checkpoint"] if resume == "auto" else []))
        assert folder_digest(run_copy) == before


def test_checkpoint_past_epochs_is_refused(run_copy, capfd):
    before = folder_digest(run_copy)
    result = in_process(capfd, "--epochs", "1", "--output-dir", str(run_copy),
                        "--resume", "auto")
    assert_refused(result, "past --epochs 1", "2 epochs")
    assert folder_digest(run_copy) == before


def test_a_checkpoint_already_at_max_steps_says_nothing_is_left(run_copy, capfd):
    """The newest checkpoint (epoch 2) is at step 46: --max-steps 40 leaves nothing to
    train, and the run says so instead of only "no epoch completed". (In this process: it
    trains nothing.)"""
    code, lines = in_process(capfd, "--epochs", "3", "--max-steps", "40", "--output-dir",
                             str(run_copy), "--resume", "auto")
    assert code == 0, lines[-40:]
    assert any("is already at step 46, --max-steps 40: nothing is left to train" in l
               for l in lines), lines[-40:]


def test_resume_auto_falls_back_past_a_corrupt_newest(run_copy):
    params = run_copy / "checkpoints" / "epoch-0002" / "model.params"
    params.write_bytes(params.read_bytes()[:100])
    proc = hvdtrain("--epochs", "3", "--output-dir", str(run_copy), "--resume", "auto")
    assert proc.returncode == 0, proc.stdout[-3000:]
    warnings = [l for l in proc.stdout.splitlines() if " WARNING " in l]
    assert any("epoch-0002 is corrupt" in l and "falling back" in l for l in warnings)
    assert "resumed from" in proc.stdout and "epoch-0001: epoch 1, step 23" in proc.stdout


def test_a_damaged_folder_refused_while_in_use_then_resumed_once_free(run_copy, capfd):
    """One resume of a copy with four things wrong, each checked as its own test did:

    - in use by another run: refused, the folder untouched (was
      test_a_second_run_into_a_folder_in_use_is_refused; it runs once the lock is free);
    - the newest checkpoint's has_states is false: a warning (was test_has_states_false_warns);
    - what a kill -9 left while pruning and saving: cleared at start (was
      test_leftovers_of_an_interrupted_prune_are_cleared_at_start);
    - metrics.jsonl's last line cut by a crash: the run starts a fresh line and
      hvdtrain-plot skips the cut one (was test_metrics_with_a_cut_last_line_get_a_fresh_line).
    """
    _edit_meta(run_copy / "checkpoints" / "epoch-0002", has_states=False)
    half = run_copy / "checkpoints" / "epoch-0005"  # a kill -9 while pruning it
    half.mkdir()
    shutil.copy(run_copy / "checkpoints" / "epoch-0002" / "meta.json", half)
    tmp = run_copy / "checkpoints" / ".tmp-epoch-0003-999999"  # a kill -9 while saving
    tmp.mkdir()
    metrics = run_copy / "metrics.jsonl"
    with open(metrics, "a") as out:
        out.write('{"event": "epoch", "epo')  # a crash mid-write
    command = ("--epochs", "3", "--output-dir", str(run_copy), "--resume", "auto")

    before = folder_digest(run_copy)
    with open(run_copy / ".hvdtrain.lock", "a+") as held:  # the first run's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        # flock belongs to the open file: cli.main's own open of the lock, in this same
        # process, finds it held.
        result = in_process(capfd, *command)
    assert_refused(result, "is in use by another run")
    assert folder_digest(run_copy) == before

    # Released: the same command now runs.
    proc = hvdtrain(*command)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "holds no optimizer state (has_states is false)" in proc.stdout
    assert "removed what interrupted saves left" in proc.stdout
    assert sorted(os.listdir(run_copy / "checkpoints")) == [
        "epoch-0001", "epoch-0002", "epoch-0003", "latest"]
    lines = metrics.read_text().splitlines()
    assert lines[-4] == '{"event": "epoch", "epo'
    assert [json.loads(l)["event"] for l in lines[-3:]] == ["start", "epoch", "end"]
    code, lines = main_in_process([str(metrics), "-o", str(run_copy / "curves.png")], capfd,
                                  main=plot_main)
    assert code == 0, lines
    assert any("skipped 1 damaged line(s)" in l for l in lines), lines
    assert (run_copy / "curves.png").exists()


def _start_and_wait_for_lock(out):
    proc = subprocess.Popen([tool("hvdtrain"), *QUICK, "--epochs", "40", "--output-dir",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lock, deadline = out / ".hvdtrain.lock", time.monotonic() + 120
    while not (lock.exists() and f"pid {proc.pid} " in lock.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "first run never started"
        time.sleep(0.1)
    return proc


def test_two_runs_at_once_the_second_is_refused_and_the_first_finishes(tmp_path):
    out = tmp_path / "run"
    first = _start_and_wait_for_lock(out)
    try:
        second = hvdtrain("--epochs", "40", "--output-dir", str(out), "--resume", "auto")
        assert first.poll() is None, "the first run ended before the second started"
        assert_refused(outcome(second), "is in use by another run",
                       f"pid {first.pid} on")
        output, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, output[-3000:]
    events = [json.loads(l)["event"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert events.count("start") == 1 and events[-1] == "end" and events.count("epoch") == 40


def test_the_lock_goes_with_a_killed_run(tmp_path):
    out = tmp_path / "run"
    first = _start_and_wait_for_lock(out)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    with open(out / ".hvdtrain.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if still held


@pytest.fixture(scope="module")
def stopped_contiguous(tmp_path_factory):
    """A run with --sampling contiguous stopped by --max-steps 5 inside its first epoch
    (made once: both tests below started with this same command)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    proc = hvdtrain("--epochs", "2", "--max-steps", "5", "--sampling", "contiguous",
                    "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:]
    return out


def test_contiguous_mid_epoch_resume_on_another_worker_count_is_refused(stopped_contiguous,
                                                                        tmp_path, capfd):
    """Contiguous parts depend on the worker count, so the samples a stopped epoch still
    owes cannot be found with another one. (The checkpoint is made to say 2 workers.)"""
    out = tmp_path / "run"
    shutil.copytree(stopped_contiguous, out)
    _edit_meta(out / "checkpoints" / "epoch-0000-step-0000005", num_workers=2)
    before = folder_digest(out)
    result = in_process(capfd, "--epochs", "2", "--sampling", "contiguous", "--output-dir",
                        str(out), "--resume", "auto")
    assert_refused(result, "stopped inside an epoch with --sampling contiguous on 2 workers")
    assert folder_digest(out) == before


def test_sampling_cannot_change_inside_a_stopped_epoch(stopped_contiguous, tmp_path, capfd):
    """The samples a stopped epoch already trained on depend on how it was split: another
    --sampling would repeat some and skip others (the run would say nothing)."""
    out = tmp_path / "run"
    shutil.copytree(stopped_contiguous, out)
    before = folder_digest(out)
    result = in_process(capfd, "--epochs", "2", "--sampling", "strided", "--output-dir",
                        str(out), "--resume", "auto")
    assert_refused(result, "stopped inside an epoch with --sampling contiguous",
                   "change it at an epoch boundary")
    assert folder_digest(out) == before


def test_a_fresh_run_into_a_folder_in_use_names_the_run_using_it(run_copy, capfd):
    """Not "continue it with --resume auto": that would be refused as well."""
    with open(run_copy / ".hvdtrain.lock", "a+") as held:  # the first run's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.seek(0)
        held.truncate()
        held.write("pid 4242 on elsewhere\n")
        held.flush()
        before = folder_digest(run_copy)
        result = in_process(capfd, "--epochs", "3", "--output-dir", str(run_copy))
        assert folder_digest(run_copy) == before
    assert_refused(result, "is in use by another run (pid 4242 on elsewhere)")
