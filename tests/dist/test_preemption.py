"""Preemption on the real launchers: a signal mid-epoch costs no step, the job leaves within a
step, the save and 5 s, with status 75 and one line naming the checkpoint, and `--resume auto`
ends where an uninterrupted run ends. Signals during start-up, during an evaluation, to one
rank only, and a second signal during the stop's save each leave a checkpoint that a resume
takes (docs/reliability.md, "Preemption")."""
import json
import os
import re
import signal
import sys
import time
import uuid

import mxnet as mx
import pytest

from helpers import REPO, tool
from hvdtrain.state.resume_from import latest_checkpoint
from jobs import (JOB_TIMEOUT, assert_same_model, job_log, kill_tagged, launcher,
                  rank_pids, reap, run_ranks, tagged_launch)

pytestmark = pytest.mark.dist
HERE = os.path.dirname(os.path.abspath(__file__))
# 1437 digits over 2 ranks x batch 7: 103 steps an epoch (the issue asks for >= 100).
STEPS = 103
FLAGS = ["--dataset", "digits", "--no-cuda", "--log-interval", "10", "--model", "simple_cnn",
         "--lr", "0.05", "--batch-size", "7", "--epochs", "2"]
PS = ["--kvstore", "dist_sync"]
PS_LAUNCH = [tool("hvdtrain-launch"), "-n", "2", "-s", "1"]
ELASTIC = ["--elastic", "--resume", "auto"]
RANK_1_FIRST = "another rank's request; 1 of 2 ranks asked"


def every_rank(signal_name):
    """Why rank 0 stops when every rank got `signal_name` (see CASES)."""
    return rf"{signal_name}; [12] of 2 ranks asked|{RANK_1_FIRST}"


STOP_LINE = re.compile(r"hvdtrain: stopped at step (\d+), (.+?) \((.+?)\); checkpoint saved: "
                       r"(\S+); exit 75: run it again with --resume auto to continue")

# Who is signalled with what, why rank 0 says the run stopped (what it voted at the step that
# decided, with how many ranks had asked: a signal to every rank reaches them a moment apart,
# and the stop may go on rank 1's request alone before rank 0 notices its own; seen under
# the elastic driver and under horovodrun --gloo), the launcher's status, and what else the
# run does. horovodrun (MPI) passes no signal on (its `sh -c mpirun` dies of TERM or USR1 and
# waits on INT), so rank 1 alone gets it, as srun's tasks do under Slurm; --gloo terminates
# its ranks at once (SIGKILL 5 s later) and ends with 1 whatever they return, or with 0:
# Horovod 0.28.1's termination thread (psutil's wait) and the rank's waiter (subprocess's) race
# to reap the rank, and the loser reads 0 (4 runs of 23 under load, 2026-12-06;
# docs/reliability.md); mpirun forwards SIGUSR1 (and SIGKILLs 1 s after a TERM or INT);
# hvdtrain-launch passes any of them on. The runs also save every 40 steps, every 0.2 s by
# rank 0's clock, or every epoch: the reference does not, and the resumed run must still end
# where it ends.
CASES = {
    "horovodrun": ("rank 1", signal.SIGTERM, RANK_1_FIRST, (75,),
                   ["--checkpoint-every", "40steps"]),
    "horovodrun-gloo": ("launcher", signal.SIGINT, every_rank("SIGTERM"), (1, 0),
                        ["--checkpoint-every", "0.2s"]),
    "mpirun": ("launcher", signal.SIGUSR1, every_rank("SIGUSR1"), (75,), []),
    "hvdtrain-launch": ("launcher", signal.SIGTERM, every_rank("SIGTERM"), (75,), PS),
    # BatchNorm: a save inside the epoch writes the running statistics averaged over the
    # ranks (each rank trains on with its own), the stop averages them; resumed, the weights
    # end bit for bit as the run that never stopped, the statistics within a few roundings
    # (tests/dist/jobs.py, STATISTICS_ULPS).
    "mpirun-bn_cnn": ("launcher", signal.SIGUSR1, every_rank("SIGUSR1"), (75,),
                      ["--model", "bn_cnn", "--checkpoint-every", "40steps"]),
    # Horovod's elastic driver: every worker signalled (Slurm's notice to its tasks, a pod's
    # deletion), or rank 1 alone. Each saves and exits 75, as in any run (the driver then
    # ends with its own status, 1); step and time checkpoints are written inside the epochs
    # meanwhile, as in any run.
    "horovodrun-elastic": ("ranks", signal.SIGTERM, every_rank("SIGTERM"), (1,),
                           ELASTIC + ["--checkpoint-every", "40steps"]),
    "horovodrun-elastic-time": ("rank 1", signal.SIGUSR1, RANK_1_FIRST, (1,),
                                ELASTIC + ["--checkpoint-every", "0.2s"]),
}


def prefix_of(name):
    if name.startswith("horovodrun-elastic"):
        return launcher("horovodrun-elastic")
    return PS_LAUNCH if name == "hvdtrain-launch" else launcher(name.split("-bn_cnn")[0])


def model_of(flags):
    return flags[flags.index("--model") + 1] if "--model" in flags else "simple_cnn"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each rank's parameters after an uninterrupted run of FLAGS, by backend (made once,
    when first asked for): horovod (Gloo; two ranks sum the same way under MPI) or dist_sync."""
    made = {}

    def get(backend, model="simple_cnn"):
        if (backend, model) not in made:
            folder = tmp_path_factory.mktemp(f"reference-{backend}-{model}")
            prefix, extra = (PS_LAUNCH, PS) if backend == "dist_sync" else \
                (launcher("ranks"), [])
            made[backend, model] = run_ranks(prefix, folder,
                                             FLAGS + extra + ["--model", model])[1]
        return made[backend, model]
    return get


def launch(name, out_dir, flags, program=None, env=None):
    """Start hvdtrain (or `program`) with two ranks under launcher `name`, tagged."""
    tag = uuid.uuid4().hex
    prefix = prefix_of(name)
    if name.startswith("mpirun"):
        prefix = prefix + ["-x", "HVDTRAIN_TEST_TAG"]
    elif name == "hvdtrain-launch":
        prefix = prefix + ["--env", "HVDTRAIN_TEST_TAG"]
    program = program or [tool("hvdtrain")]
    for key, value in (env or {}).items():  # passed as the tag is
        os.environ[key] = value
    try:
        proc = tagged_launch(prefix + program + flags + ["--output-dir", str(out_dir)], tag)
    finally:
        for key in env or {}:
            del os.environ[key]
    return proc, tag


def wait_for(proc, pattern, after=None, timeout=180):
    """Wait until the job's output matches `pattern` (after the first match of `after`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = job_log(proc)
        if after is not None:
            found = re.search(after, text)
            text = text[found.end():] if found else ""
        if re.search(pattern, text):
            return
        assert proc.poll() is None, f"the job ended ({proc.returncode}) before {pattern!r}"
        time.sleep(0.05)
    pytest.fail(f"no {pattern!r} after {timeout} s")


def stop_line(out):
    """(step, where, why, checkpoint) of the job's one stop line."""
    found = STOP_LINE.findall(out)
    assert len(found) == 1, out[-4000:]
    step, where, why, path = found[0]
    return int(step), where, why, path


def records(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", list(CASES))
def test_a_signal_mid_epoch_costs_no_step_and_resume_auto_ends_as_an_uninterrupted_run(
        name, reference, tmp_path):
    target, signum, why, statuses, extra = CASES[name]
    proc, tag = launch(name, tmp_path, FLAGS + extra)
    try:
        # Inside the second epoch, 20 steps in: the stop is mid-epoch, after a checkpoint.
        wait_for(proc, rf"step 20/{STEPS}", after=r"epoch 1/2 ")
        if target == "launcher":
            victims = [proc.pid]
        else:
            ranks = rank_pids(tag)
            victims = [ranks[1]] if target == "rank 1" else list(ranks.values())
        for victim in victims:
            os.kill(victim, signum)
        signalled = time.monotonic()
        proc.wait(timeout=120)
        seconds = time.monotonic() - signalled
    finally:
        out = reap(proc, tag, timeout=120)
    assert proc.returncode in statuses, out[-3000:]
    step, where, said_why, path = stop_line(out)
    assert re.fullmatch(why, said_why), said_why
    assert STEPS < step < 2 * STEPS and where == f"{14 * (step - STEPS)} samples into epoch 2"
    assert path == str(tmp_path / "checkpoints" / f"epoch-0001-step-{step:07d}")
    assert latest_checkpoint(str(tmp_path)) == path
    # Steps lost: 0. The checkpoint is at the last step the job trained.
    stop = records(tmp_path)[-1]
    assert (stop["event"], stop["step"], stop["stopped_by"]) == ("stop", step, said_why)
    assert json.load(open(os.path.join(path, "meta.json")))["step"] == step
    # From the signal to the job's exit: at most a step, the save and 5 s.
    step_s = stop["epoch_time"] / stop["steps"]
    save_s = float(re.search(re.escape(path) + r" \(written in ([\d.]+) s", out).group(1))
    print(f"{name}: {signal.Signals(signum).name} to the {target}: the job exited "
          f"{seconds:.1f} s later (bound {step_s + save_s + 5:.1f} s: a step {1e3 * step_s:.0f} "
          f"ms, the save {save_s:.1f} s, 5 s), stopped at step {step}")
    assert seconds <= step_s + save_s + 5
    saved = re.findall(r"checkpoint saved: \S+/epoch-(\d+)-step-(\d+) ", out)
    if "40steps" in extra:  # at steps 40, 80, ... (a few later while a write still runs)
        # Every multiple of 40 before the stop: the signal leaves the test at step 20 of
        # epoch 2 (step 123) but may reach fast ranks after step 160 (CI's machine: 161).
        assert [int(s) // 40 for _, s in saved if int(s) < step] == \
            list(range(1, (step - 1) // 40 + 1)), saved
        assert all(int(s) % 40 < 5 for _, s in saved if int(s) < step), saved
    elif "0.2s" in extra:  # by rank 0's clock, which the other rank learned in the vote
        assert len([s for _, s in saved if int(s) < step]) >= 2, saved
    results, resumed, again = run_ranks(prefix_of(name), tmp_path,
                                        FLAGS + extra + ["--output-dir", str(tmp_path),
                                                         "--resume", "auto"])
    assert f"resumed from {path}: epoch 1, step {step}" in again, again[-3000:]
    assert [r["steps"] for r in results] == [2 * STEPS] * 2
    model = model_of(extra)
    expected = reference("dist_sync" if name == "hvdtrain-launch" else "horovod", model)
    for rank in (0, 1):
        assert_same_model(expected[rank], resumed[rank])


def test_signals_during_start_up_and_evaluation_to_one_rank_each_leave_a_checkpoint(
        reference, tmp_path):
    """Rank 0 signalled during start-up: every rank trains the first step, saves it and
    exits 75. Resumed, rank 1 signalled during epoch 1's evaluation: the evaluation ends, the
    epoch's checkpoint is saved, exit 75. Resumed again, the run ends as an uninterrupted
    one. (mpirun: it ends with its ranks' status.)"""
    worker = [sys.executable, os.path.join(HERE, "preempt_worker.py")]
    lives = [("start-up", "0", []), ("evaluation", "1", ["--resume", "auto"])]
    said = []
    for at, rank, resume in lives:
        proc, tag = launch("mpirun", tmp_path, FLAGS + resume, program=worker,
                           env={"HVDTRAIN_TEST_SIGNAL_AT": at, "HVDTRAIN_TEST_SIGNAL_RANK": rank})
        try:
            proc.wait(timeout=JOB_TIMEOUT)
        finally:
            out = reap(proc, tag, timeout=60)
        assert proc.returncode == 75, out[-3000:]
        assert f"rank {rank}: SIGTERM to myself during {at}" in out
        said.append(stop_line(out))
    assert said[0] == (1, "14 samples into epoch 1", "SIGTERM; 1 of 2 ranks asked",
                       str(tmp_path / "checkpoints" / "epoch-0000-step-0000001"))
    # Rank 0 was not signalled: it names no signal of its own.
    assert said[1] == (STEPS, "after epoch 1", "another rank's request; 1 of 2 ranks asked",
                       str(tmp_path / "checkpoints" / "epoch-0001"))
    evaluated = [r for r in records(tmp_path) if r["event"] == "epoch"]
    assert [(r["epoch"], r["test_acc"] is not None) for r in evaluated] == [(0, True)]
    results, resumed, out = run_ranks(launcher("mpirun"), tmp_path, FLAGS + [
        "--output-dir", str(tmp_path), "--resume", "auto"])
    assert f"resumed from {tmp_path}/checkpoints/epoch-0001: epoch 1, step {STEPS}" in out
    for rank in (0, 1):
        assert_same_model(reference("horovod")[rank], resumed[rank])


def test_a_second_signal_during_the_stops_save_ends_the_job_and_keeps_the_previous_checkpoint(
        tmp_path):
    """Storage slowed to 60 s for the stop's checkpoint: a second SIGTERM to rank 0 ends it at
    once (128 + 15), and the checkpoint being written never becomes the newest."""
    worker = [sys.executable, os.path.join(HERE, "preempt_worker.py")]
    proc, tag = launch("mpirun", tmp_path, FLAGS, program=worker,
                       env={"HVDTRAIN_TEST_SLOW_WRITE": "60"})
    try:
        wait_for(proc, rf"step 20/{STEPS}", after=r"epoch 1/2 ")
        rank_0 = rank_pids(tag, "preempt_worker.py")[0]
        os.kill(rank_0, signal.SIGTERM)
        wait_for(proc, r"slow write: \.tmp-epoch-0001-step-\d+")
        time.sleep(2.5)  # past the window in which a repeat is the same request
        os.kill(rank_0, signal.SIGTERM)
        second = time.monotonic()
        proc.wait(timeout=60)
        seconds = time.monotonic() - second
    finally:
        out = reap(proc, tag, timeout=60)
    print(f"second SIGTERM: the job exited {seconds:.1f} s later")
    assert proc.returncode != 0 and seconds < 30, out[-3000:]
    assert "rank 0: got SIGTERM while stopping for SIGTERM: exiting at once" in out
    assert "Exit code:    143" in out  # mpirun names the rank's status
    folder = tmp_path / "checkpoints"
    assert [e for e in os.listdir(folder) if e.startswith(".tmp-epoch-0001-step-")]
    assert latest_checkpoint(str(tmp_path)) == str(folder / "epoch-0001")
    kill_tagged(tag)


# Slurm's part, played here: srun starts the command as two tasks on this host (under mpirun),
# scontrol notes a requeue. Slurm's --signal reaches the tasks: the test signals the ranks.
FAKE_SRUN = """#!/bin/bash
while [[ $1 == --* ]]; do shift; done  # srun's own options (--mpi=pmix ...)
exec mpirun --allow-run-as-root --bind-to none --tag-output -np 2 -x PATH "$@"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "$SCONTROL_LOG"
"""


def test_the_slurm_requeue_script_finishes_across_two_lives_as_in_one(reference, tmp_path):
    """examples/slurm/requeue.sbatch under a stand-in Slurm: the first life is signalled
    mid-epoch (SIGUSR1 to its tasks, as --signal=USR1@90 does), exits 75 and requeues the job;
    the second runs the same script to the end. The model it saves is the uninterrupted one."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    requeues = tmp_path / "requeues"
    env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_CPUS_PER_TASK": "1", "SCONTROL_LOG": str(requeues),
           "HVDTRAIN_HOME": os.path.dirname(os.path.dirname(os.path.dirname(sys.executable))),
           "HVDTRAIN_OUTPUT_DIR": str(tmp_path / "run")}
    script = os.path.join(REPO, "examples", "slurm", "requeue.sbatch")
    statuses = []
    for life in (1, 2):
        tag = uuid.uuid4().hex
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            proc = tagged_launch(["bash", script] + FLAGS, tag)
        finally:
            for key, value in saved.items():
                if value is None:
                    del os.environ[key]
                else:
                    os.environ[key] = value
        try:
            if life == 1:
                wait_for(proc, rf"step 20/{STEPS}", after=r"epoch 1/2 ")
                for pid in rank_pids(tag).values():  # Slurm signals every task of the step
                    os.kill(pid, signal.SIGUSR1)
            proc.wait(timeout=JOB_TIMEOUT)
        finally:
            out = reap(proc, tag, timeout=60)
        statuses.append(proc.returncode)
        if life == 1:
            assert "requeueing job 4242" in out, out[-3000:]
    assert statuses == [75, 0]
    assert requeues.read_text() == "requeue 4242\n"  # once, by the first life
    final = {k: v.asnumpy() for k, v in mx.nd.load(str(tmp_path / "run" / "model.params")).items()}
    assert_same_model(reference("horovod")[0], final)
