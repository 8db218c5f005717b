"""The jobs of test_slow_ranks.py: a rank 0 that pauses for minutes, under MPI and Gloo.

They spend minutes asleep, so one test worker starts them early (tests/dist/conftest.py)
and whichever worker runs test_slow_ranks.py waits for them: with ``pytest -n 2`` the
workers are separate processes, so a job is shared through files (its output, its pid and
its exit status in a folder of the session), not through a Popen object."""
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers import JOB_PROCESS_GROUP, REPO, job_path, record_job
from jobs import DIGITS, launcher, lower_priority_of_busy_threads

HERE = os.path.dirname(os.path.abspath(__file__))
GLOO_AND_MPI = ["horovodrun", "horovodrun-gloo"]
PAUSE_S, SLOW_CHECKPOINT_S = 200, 150
FINISH_TIMEOUT = 900  # from the jobs' start: a pause of 200 s and start-ups on a busy machine
# Horovod's background threads exchange once a cycle (1 ms by default) while rank 0 pauses.
# Under Gloo that costs CPU: beside two busy loops (2026-12-06, the 2-core VM) the four
# such threads of a paused Gloo job used 22% of a core (0.55 s in 10 s each, much of it
# system time; nice 19 left them at 0.48 s), 44 s of CPU over the 200 s pause, nothing
# under MPI. With a 20 ms cycle they used less than 0.05 s in 10 s. What these jobs show
# (a pause is only slow) does not depend on how often the idle exchange runs.
JOB_ENV = {"HOROVOD_CYCLE_TIME": "20"}


def session_folder(tmp_path_factory):
    """A folder every test worker of this session shares (pytest-xdist gives each worker
    its own base temporary folder, under one per session)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class SharedJob:
    """A command started in its own process group by one test process, which any test process of
    the same pytest session can wait for: its output, pid and exit status are files in
    `folder`. `env`: variables set for it on top of the test process's own."""

    def __init__(self, folder, cmd, env=None):
        self.folder, self.cmd = str(folder), list(map(str, cmd))
        self.env = dict(env or {})
        self.tag = "shared-job-" + os.path.basename(self.folder)  # in its processes' environment
        self.log = os.path.join(self.folder, "output.log")
        self.status = os.path.join(self.folder, "status")
        self._proc = None  # the Popen, in the process that started the job

    def start(self):
        """Start the command (the shell that wraps it writes its exit status when it ends)."""
        os.makedirs(self.folder, exist_ok=True)
        env = dict(os.environ, PATH=job_path(),
                   HVDTRAIN_TEST_TAG=self.tag, **self.env)
        wrapped = ["sh", "-c", '"$@"; echo $? > "$0.part" && mv "$0.part" "$0"', self.status,
                   *self.cmd]
        with open(self.log, "w") as out:
            proc = subprocess.Popen(wrapped, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=REPO, **JOB_PROCESS_GROUP)
        with open(os.path.join(self.folder, "pid"), "w") as pid:
            pid.write(str(proc.pid))
        self._proc = proc  # reaped by this process's kill() or when it exits
        return self

    def done(self):
        return os.path.exists(self.status)

    def finish(self, deadline):
        """Wait until the monotonic `deadline` (then kill the job and fail); the
        CompletedProcess. The output is recorded for the failure report."""
        while not self.done() and time.monotonic() < deadline:
            time.sleep(1)
        timed_out = not self.done()
        if timed_out:
            self.kill()
        output = self.output()
        record_job(self.cmd, output=output)
        if timed_out:
            pytest.fail(f"timed out waiting for: {' '.join(self.cmd)}")
        with open(self.status) as status:
            return subprocess.CompletedProcess(self.cmd, int(status.read()), output, None)

    def output(self):
        with open(self.log, errors="replace") as src:
            return src.read()

    def kill(self):
        """SIGKILL the job's whole session if it still runs."""
        with open(os.path.join(self.folder, "pid")) as pid:
            try:
                os.killpg(int(pid.read()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._proc is not None:
            self._proc.wait()


#: What each program prints as its rank 0 starts to pause.
PAUSE_LINES = {"library": "rank 0 pauses", "checkpoint": "slow storage: this checkpoint takes"}


def _lower_priority_once_paused(job, line, deadline):
    """When `job` prints `line`, lower its busy threads' priority (the rank left waiting
    spins in Horovod's background thread: jobs.lower_priority_of_busy_threads); the pause
    itself is what the tests wait out, at no cost to the tests running beside it."""
    while time.monotonic() < deadline and not job.done():
        if line in job.output():
            lower_priority_of_busy_threads(job.tag)
            return
        time.sleep(1)


def _job_commands(folder):
    """{(program, launcher): (command, the worker's output folder or None)}."""
    commands = {}
    for name in GLOO_AND_MPI:
        commands[("library", name)] = (launcher(name) + [
            sys.executable, os.path.join(HERE, "paused_program.py"), str(PAUSE_S)], None)
        run_root = os.path.join(folder, f"slow-checkpoint-{name}")
        commands[("checkpoint", name)] = (launcher(name) + [
            sys.executable, os.path.join(HERE, "slow_storage_worker.py"),
            str(SLOW_CHECKPOINT_S), run_root, *DIGITS, "--model", "mlp", "--batch-size",
            "32", "--epochs", "2", "--stall-timeout", "60", "--output-dir",
            os.path.join(run_root, "run")], run_root)
    return commands


class PausedJobs:
    """The four jobs (two programs x MPI and Gloo) of this session, started by the first
    test process that asks (:meth:`start_or_join`) and joined by the others."""

    def __init__(self, folder):
        self.folder = os.path.join(str(folder), "paused-jobs")
        self.jobs, self.started_here, self.deadline = {}, False, None

    def start_or_join(self):
        os.makedirs(self.folder, exist_ok=True)
        record = os.path.join(self.folder, "started.json")
        for key, (cmd, run_root) in _job_commands(self.folder).items():
            self.jobs[key] = (SharedJob(os.path.join(self.folder, "-".join(key)), cmd, JOB_ENV),
                              run_root)
        with open(os.path.join(self.folder, "lock"), "w") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # one starter per session
            if not os.path.exists(record):
                for (program, _), (job, run_root) in self.jobs.items():
                    if run_root:
                        os.makedirs(run_root, exist_ok=True)
                    job.start()
                    threading.Thread(target=_lower_priority_once_paused, daemon=True,
                                     args=(job, PAUSE_LINES[program],
                                           time.monotonic() + FINISH_TIMEOUT)).start()
                with open(record, "w") as out:
                    json.dump({"wall_time": time.time()}, out)
                self.started_here = True
        with open(record) as src:
            started = json.load(src)["wall_time"]
        self.deadline = time.monotonic() + FINISH_TIMEOUT - (time.time() - started)
        return self

    def finish(self, key):
        """(the CompletedProcess of job `key`, its worker's output folder)."""
        job, run_root = self.jobs[key]
        return job.finish(self.deadline), run_root

    def stop(self, others_may_wait):
        """At the end of the session of the process that started them: kill what still runs
        (after waiting for the other test processes' tests, bounded, if `others_may_wait`)."""
        if not self.started_here:
            return
        while others_may_wait and time.monotonic() < self.deadline \
                and not all(job.done() for job, _ in self.jobs.values()):
            time.sleep(1)
        for job, _ in self.jobs.values():
            job.kill()
