"""Resume, failing fast when a rank dies, and the finite-loss guard, with real launchers."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from hvdtrain.state.resume_from import latest_checkpoint
from helpers import (folder_digest, main_in_process, record_job, run_command,
                     split_by_process, tool)
from jobs import (DIGITS, JOB_TIMEOUT, assert_same_params, job_log, kill_tagged, launcher,
                  lower_priority_of_busy_threads_soon, rank_pids, reap, role_pids, run_ranks,
                  tagged_launch, tagged_pids)

pytestmark = pytest.mark.dist
HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = DIGITS + ["--model", "simple_cnn", "--lr", "0.05", "--batch-size", "32"]


# A resume from an epoch's end matching an uninterrupted run, BatchNorm included:
# tests/dist/test_resume.py::test_resume_from_an_epoch_end_matches_an_uninterrupted_run.


def test_resume_from_two_ranks_to_one(tmp_path):
    run_ranks(launcher("ranks"), tmp_path,
              FLAGS + ["--epochs", "2", "--output-dir", str(tmp_path)])
    results, _, out = run_ranks([], tmp_path, FLAGS + ["--epochs", "3", "--output-dir",
                                                       str(tmp_path), "--resume", "auto"])
    assert "resuming with a global batch of 32 instead of 64" in out
    assert results[0]["num_workers"] == 1 and results[0]["test_acc"] >= 0.9
    assert results[0]["steps"] == 2 * 23 + 45  # two epochs at 2 ranks, one at 1 rank


LONG_RUN = [tool("hvdtrain"), *DIGITS, "--epochs", "500"]


ALL_LAUNCHERS = ["horovodrun", "horovodrun-gloo", "mpirun", "hvdtrain-launch"]


@pytest.fixture
def long_job():
    """Start long digits runs (:func:`start_long_job`); whatever the test's outcome, every
    process they started is killed at its end, so a failed test leaves no job behind to
    slow the rest of the suite down."""
    started = []

    def start(name, extra=()):
        proc, tag, victims = start_long_job(name, extra)
        started.append((proc, tag))
        return proc, tag, victims

    yield start
    _kill_jobs(started)


def _kill_jobs(started):
    """SIGKILL each (launcher, tag) job's process group and every process with its tag."""
    for proc, tag in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_tagged(tag)
        proc.wait()


def start_long_job(name, extra=(), record=True):
    """Start a long digits run with two workers under launcher `name`; return the launcher
    process, the tag its processes carry, and the pids of the two training processes
    (rank or worker order) once both run. Use it through the `long_job` fixture."""
    tag = uuid.uuid4().hex
    if name == "hvdtrain-launch":
        cmd = [tool("hvdtrain-launch"), "-n", "2", "-s", "1", "--env", "HVDTRAIN_TEST_TAG",
               *LONG_RUN, "--kvstore", "dist_sync", *extra]
        victims = lambda: role_pids(tag, "worker")  # noqa: E731
    else:
        cmd = launcher(name) + (["-x", "HVDTRAIN_TEST_TAG"] if name == "mpirun" else []) \
            + LONG_RUN + list(extra)
        victims = lambda: [pid for _, pid in sorted(rank_pids(tag).items())]  # noqa: E731
    proc = tagged_launch(cmd, tag, record)
    deadline = time.monotonic() + START_TIMEOUT
    while len(pids := victims()) < 2:
        assert proc.poll() is None, f"the launcher exited ({proc.returncode}) before both ranks ran"
        assert time.monotonic() < deadline, f"ranks not started after {START_TIMEOUT}s"
        time.sleep(0.2)
    return proc, tag, pids  # the list that was checked: a second look can differ


# Outer bounds, not measurements: on a busy 2-core machine a start-up can take a minute.
START_TIMEOUT = 180


def _wait_for_training(proc, out_dir, timeout=START_TIMEOUT):
    """Wait until rank 0 has finished an epoch (so start-up is over on every rank, and the
    ranks are inside the next one). A job that ends first fails the test at once (its
    output is in the failure report)."""
    deadline = time.monotonic() + timeout
    metrics = out_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and '"event": "epoch"' in metrics.read_text():
            return
        assert proc.poll() is None, f"the job ended ({proc.returncode}) before its first epoch"
        time.sleep(0.2)
    pytest.fail(f"no epoch finished after {timeout}s")


@pytest.mark.parametrize("name", ALL_LAUNCHERS)
def test_kill_9_of_one_rank_fails_the_job_fast(name, tmp_path, long_job):
    """kill -9 of one rank in the middle of training: the launcher ends the whole job with a
    non-zero status instead of hanging (reap's bound)."""
    proc, tag, ranks = long_job(name, ["--output-dir", str(tmp_path)])
    _wait_for_training(proc, tmp_path)  # past start-up: the ranks are inside an epoch
    os.kill(ranks[1], signal.SIGKILL)
    killed = time.monotonic()
    reap(proc, tag, timeout=120)
    print(f"{name}: exited {proc.returncode} {time.monotonic() - killed:.1f}s after kill -9 "
          f"of one rank")
    assert proc.returncode != 0


# Long enough that no healthy phase of a digits run on a loaded 2-core machine goes without
# progress for that long (start-up milestones count), short enough not to idle the suite.
STALL_S = "15"


@pytest.fixture(scope="module")
def frozen_jobs(tmp_path_factory):
    """One long job per launcher, each with rank 1 SIGSTOPped once it trains:
    {launcher: (proc, tag, time of the SIGSTOP, busy threads lowered)}, or the reason its
    start failed.

    They start one after another (start-ups share 2 cores badly), and each job's 15 s
    stall timeout (STALL_S) runs while the next one starts: the four tests wait out one timeout
    between them, not four. Each test reaps its own job and reports its output."""
    jobs, started = {}, []
    for name in ALL_LAUNCHERS:
        out_dir = tmp_path_factory.mktemp(f"frozen-{name}")
        try:
            proc, tag, ranks = start_long_job(name, ["--stall-timeout", STALL_S, "--output-dir",
                                                     str(out_dir)], record=False)
            started.append((proc, tag))
            _wait_for_training(proc, out_dir)
            os.kill(ranks[1], signal.SIGSTOP)
            # The rank left waiting spins; its busy thread is lowered while the next starts.
            jobs[name] = (proc, tag, time.monotonic(), lower_priority_of_busy_threads_soon(tag))
        except (AssertionError, pytest.fail.Exception) as err:
            jobs[name] = f"{name}: {err}"
    yield jobs
    _kill_jobs(started)


@pytest.mark.slow  # waits out a 15 s stall timeout after start-up (once for all four)
@pytest.mark.parametrize("name", ALL_LAUNCHERS)
def test_a_frozen_rank_ends_the_job(name, frozen_jobs):
    """SIGSTOP of one rank: the others' watchdogs fire after --stall-timeout, the launcher
    stops the job, and nothing is left (under MPI Horovod's own stall check never fires).
    The watchdog's line (not Horovod's backstop at 1.5 x the timeout) says what ended it."""
    job = frozen_jobs[name]
    if isinstance(job, str):
        pytest.fail(job)
    proc, tag, stopped, lowered = job
    record_job(proc.cmd, path=proc.log_path)
    out = reap(proc, tag, timeout=max(1.0, stopped + 150 - time.monotonic()))
    print(f"{name}: exited {proc.returncode} {time.monotonic() - stopped:.1f}s after SIGSTOP "
          f"of one rank ({len(lowered)} busy threads given the lowest priority)")
    assert proc.returncode != 0
    assert "with no step completed" in out and f"--stall-timeout {STALL_S}" in out


@pytest.mark.parametrize("name,signum", [("horovodrun", signal.SIGTERM),
                                         ("mpirun", signal.SIGTERM),
                                         ("horovodrun-gloo", signal.SIGINT),
                                         ("horovodrun-gloo", signal.SIGTERM),
                                         ("hvdtrain-launch", signal.SIGTERM)])
def test_a_signal_to_the_launcher_pid_alone_stops_every_rank(name, signum, tmp_path,
                                                             long_job):
    """What a supervisor, ``docker stop`` or a Kubernetes launcher pod does: signal the
    launcher's pid, not its process group. horovodrun (MPI) has become ``sh -c mpirun``, so
    the shell alone dies; the ranks notice their launcher is gone, save a checkpoint at the
    next step boundary, and exit. Under --gloo horovodrun terminates the ranks (which save),
    and hvdtrain-launch passes the signal on; mpirun SIGKILLs its ranks 1 s after its TERM,
    so whether they saved is not asserted there (docs/reliability.md, "Preemption")."""
    proc, tag, _ = long_job(name, ["--output-dir", str(tmp_path)])
    _wait_for_training(proc, tmp_path)  # ranks watch their launcher once hvdtrain runs
    os.kill(proc.pid, signum)
    signalled = time.monotonic()
    proc.wait(timeout=90)
    while tagged_pids(tag) and time.monotonic() - signalled < 90:
        time.sleep(0.2)
    print(f"{name}: every process gone {time.monotonic() - signalled:.1f}s after "
          f"{signal.Signals(signum).name} to the launcher pid")
    assert tagged_pids(tag) == [], "ranks outlived their launcher by 90 s"
    if name != "mpirun":
        out = job_log(proc)
        stop = re.search(r"hvdtrain: stopped at step (\d+), .*checkpoint saved: (\S+);", out)
        assert stop, out[-3000:]
        # Saved where it stopped: a step checkpoint mid-epoch, or the epoch's own checkpoint
        # when the stop landed on an epoch's last step (both have happened under load).
        assert latest_checkpoint(str(tmp_path)) == stop.group(2)
        with open(os.path.join(stop.group(2), "meta.json")) as f:
            assert json.load(f)["step"] == int(stop.group(1))


def test_nan_on_one_rank_stops_all_ranks_at_the_same_step(tmp_path):
    out_dir = tmp_path / "run"
    cmd = launcher("horovodrun-gloo") + [
        sys.executable, os.path.join(HERE, "failing_worker.py"), *FLAGS, "--epochs", "3",
        "--output-dir", str(out_dir), "--finite-check-every", "5"]
    proc = run_command(cmd, timeout=JOB_TIMEOUT, env={"HVDTRAIN_FAULT": "nan",
                                                      "HVDTRAIN_FAULT_RANK": "1"})
    assert proc.returncode != 0
    errors = [l for l in proc.stdout.splitlines() if "non-finite loss" in l]
    # Epoch 2 starts at step 24; batch 3 of it is step 26; the next check is at step 30.
    assert {e.split("[rank ")[1][0] for e in errors} == {"0", "1"}, proc.stdout[-3000:]
    assert all("non-finite loss at step 26 on rank 1; all ranks stopped at step 30" in e
               for e in errors)
    checkpoints = sorted(os.listdir(out_dir / "checkpoints"))
    assert checkpoints == ["epoch-0001", "latest"]
    import mxnet as mx
    saved = mx.nd.load(str(out_dir / "checkpoints" / "epoch-0001" / "model.params"))
    assert all(np.isfinite(v.asnumpy()).all() for v in saved.values())
    assert not (out_dir / "model.params").exists()


def test_bad_input_leaves_checkpoints_and_metrics_alone(tmp_path, capfd):
    run = tmp_path / "run"
    proc = run_command([tool("hvdtrain"), *DIGITS, "--kvstore", "none", "--epochs", "2",
                        "--output-dir", str(run)], timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout
    before = folder_digest(run)
    corrupt = tmp_path / "corrupt"
    (corrupt / "checkpoints").mkdir(parents=True)
    os.system(f"cp -r {run}/checkpoints/epoch-0002 {corrupt}/checkpoints/")
    params = corrupt / "checkpoints" / "epoch-0002" / "model.params"
    params.write_bytes(params.read_bytes()[:100])
    cifar = tmp_path / "cifar"
    cifar.mkdir()
    from hvdtrain.data.datasets import write_cifar_files
    write_cifar_files(str(cifar), 10, 2)
    (cifar / "test_batch.bin").write_bytes((cifar / "test_batch.bin").read_bytes()[:-7])
    table = [
        (["--batch-size", "-4"], "--batch-size must be positive"),
        (["--epochs", "0"], "--epochs must be positive"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints must be positive"),
        (["--model", "nope"], "unknown model"),
        (["--optimizer", "nope"], "invalid choice"),
        (["--resume", str(tmp_path / "missing")], "does not exist"),
        (["--resume", str(corrupt / "checkpoints" / "epoch-0002")], "is corrupt"),
        (["--model", "mlp", "--resume", "auto"], "--model mlp (checkpoint: simple_cnn)"),
        (["--dataset", "cifar10", "--data-dir", str(cifar)], "test_batch.bin is not a CIFAR-10"),
        (["--dataset", "cifar10", "--data-dir", str(tmp_path / "nodata")], "files missing"),
        (["--output-dir", "/proc/self/nope"], "is not writable"),
        # Values that parse but cannot train: refused before metrics.jsonl gets a record.
        (["--lr", "inf"], "--lr must be a finite number"),
        (["--lr", "nan"], "--lr must be a finite number"),
        (["--wd", "inf"], "--wd must be a finite number"),
        (["--lr-decay-factor", "inf"], "--lr-decay-factor must be a finite number"),
        (["--lr-decay-factor", "2"], "--lr-decay-factor must be in (0, 1]"),
        (["--warmup-epochs", "inf"], "--warmup-epochs must be a finite number"),
        (["--grad-bucket-mb", "inf"], "--grad-bucket-mb must be a finite number"),
        (["--momentum", "5"], "--momentum must be in [0, 1)"),
        (["--stall-timeout=-1"], "--stall-timeout must be >= 0"),
    ]
    # In process (cli.main), not 21 processes importing MXNet: what a real process adds
    # to a refusal is covered by tests/unit/test_cli.py's
    # test_a_refusal_is_one_line_from_the_whole_process.
    for flags, needle in table:
        argv = [*DIGITS, "--kvstore", "none", "--epochs", "3"]
        if "--output-dir" not in flags:
            argv += ["--output-dir", str(run)]
        code, lines = main_in_process(argv + flags, capfd)
        assert code == 2 and len(lines) == 1 and needle in lines[0], (flags, lines)
        assert folder_digest(run) == before, f"{flags} changed the output folder"


FULL_DISK_LINE = "hvdtrain: error: cannot write {disk}/checkpoints/.tmp-epoch-0002"
# The checkpoint of epoch 2 (step 24) is written in the background: its failure stops every
# rank at the next step boundary whose vote carries it (step 25 unless the write is slow),
# or at the end of epoch 3 (step 36), which waits for the write.
PEER_LINE = re.compile(r"hvdtrain: error: rank 0 could not write its outputs \(its own line "
                       r"says why\); every rank stopped at step (2[5-9]|3[0-6])")


def _full_disk_run(name, disk):
    """One run on a 2 MiB tmpfs, which holds the first checkpoint (1.2 MB) but not the
    second; checks what a user sees and what is left on the disk."""
    prefix = [] if name == "single" else launcher(name)
    store = ["--kvstore", "none"] if name == "single" else []
    proc = run_command(prefix + [tool("hvdtrain"), *DIGITS, *store, "--epochs", "3",
                                 "--output-dir", str(disk)], timeout=JOB_TIMEOUT)
    assert proc.returncode == 1
    ranks = split_by_process(proc.stdout)
    # Each rank says one line, and only that: no traceback, no native crash report.
    errors = {who: [l for l in lines if "error" in l.lower() or "Traceback" in l
                    or "Segmentation" in l or "signal" in l.lower()]
              for who, lines in ranks.items() if who != "launcher"}
    if name == "single":
        errors = {"rank 0": [l for l in ranks["launcher"] if "error" in l.lower()
                             or "Traceback" in l]}
    assert sorted(errors) == (["rank 0"] if name == "single" else ["rank 0", "rank 1"])
    assert len(errors["rank 0"]) == 1, errors
    assert errors["rank 0"][0].startswith(FULL_DISK_LINE.format(disk=disk))
    assert errors["rank 0"][0].endswith(": no space left on device"), errors
    if name != "single":
        # The surviving rank: one line, exit 1 (was: killed without a word under MPI, a
        # Horovod traceback under Gloo, now and then a SIGSEGV in Horovod's enqueue).
        assert len(errors["rank 1"]) == 1 and PEER_LINE.fullmatch(errors["rank 1"][0]), errors
    assert sorted(os.listdir(disk / "checkpoints")) == ["epoch-0001", "latest"]
    assert latest_checkpoint(str(disk)) == str(disk / "checkpoints" / "epoch-0001")
    records = [json.loads(l) for l in (disk / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] in (["start", "epoch", "epoch"],
                                             ["start", "epoch", "epoch", "epoch"])


@contextlib.contextmanager
def _small_disk(folder):
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize("name", ["single", "horovodrun", "horovodrun-gloo"])
def test_full_disk_during_a_checkpoint_is_one_line_and_exit_1(name, tmp_path):
    """Rank 0 fails to write its second checkpoint; every rank stops at that step with one
    line each and exit status 1."""
    with _small_disk(tmp_path / "disk") as disk:
        _full_disk_run(name, disk)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ranks", "horovodrun-gloo"])
def test_full_disk_on_rank_0_never_crashes_the_other_rank(name, tmp_path):
    """The chance failure this replaces: rank 1 died of SIGSEGV in Horovod's enqueue
    (exit 134) when rank 0 left on a full disk while rank 1 was in its next collective.
    Now the ranks agree after rank 0's writes and leave together, so no rank is ever inside
    a collective when its peer goes. Repeated, since the old crash came by chance: four
    attempts here under each of Horovod's controllers (MPI, started by mpirun as horovodrun
    starts it; Gloo) and one in test_full_disk_during_a_checkpoint_is_one_line_and_exit_1
    under horovodrun itself, which `make test` runs too."""
    for attempt in range(4):
        with _small_disk(tmp_path / f"disk{attempt}") as disk:
            _full_disk_run(name, disk)


def test_a_write_that_fails_while_the_save_vote_reads_it_stops_every_rank_together(tmp_path):
    """Rank 0's background write fails between the two things the save vote asks of it
    (failed? still running?), at a step where the next save is due (--checkpoint-every
    1steps). Every rank stops at the same step with one line and exit 1, none inside a
    collective its peer has left (before: rank 0 started that save alone, raised, and left
    rank 1 in its next allreduce)."""
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "racy_write_program.py")
    proc = run_command(launcher("ranks") + [sys.executable, program, *DIGITS,
                                                 "--epochs", "1", "--checkpoint-every",
                                                 "1steps", "--output-dir", str(tmp_path)],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 1, proc.stdout
    ranks = split_by_process(proc.stdout)
    errors = {who: [l for l in lines if "error" in l.lower() or "Traceback" in l]
              for who, lines in ranks.items() if who != "launcher"}
    assert sorted(errors) == ["rank 0", "rank 1"], ranks
    assert errors["rank 0"] == ["hvdtrain: error: cannot write the checkpoint: no space left "
                                "on device"], errors
    assert len(errors["rank 1"]) == 1 and re.fullmatch(
        r"hvdtrain: error: rank 0 could not write its outputs \(its own line says why\); "
        r"every rank stopped at step \d+", errors["rank 1"][0]), errors
