"""How `make bench` runs its processes and keeps its figures.

Each run goes into a session of its own, so the whole of it (horovodrun, sh, mpirun, the
ranks) stops as one process group however the bench is stopped; figures are rewritten to
the JSON file after every row, so an interrupted bench keeps what it measured; and one
bench runs per machine, since two at once share the cores and both measure nonsense.
"""
import fcntl
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid


def _signal_groups(groups, sig):
    for group in groups:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:  # the whole run has ended
            pass


def _group_alive(group):
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


class Runs:
    """Starts worker processes, each told where to write its figures, and collects them."""

    def __init__(self, folder, env, live=None):
        self.folder = folder
        self.env = env
        self.live = [] if live is None else live  # shared by every runner made by with_env

    def with_env(self, extra):
        """The same runner with `extra` added to the processes' environment."""
        return Runs(self.folder, dict(self.env, **extra), self.live)

    def start(self, cmd):
        prefix = os.path.join(self.folder, f"run-{uuid.uuid4().hex}")
        # Its own session: the whole run (horovodrun, sh, mpirun, ranks) can be stopped as
        # one process group, however the bench itself is stopped.
        proc = subprocess.Popen(cmd + ["--out", prefix], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=self.env,
                                start_new_session=True)
        self.live.append(proc)
        return proc, prefix

    def stop_all(self, grace=5.0):
        """Stop every run still going, with all its processes: TERM first, so that mpirun
        removes its session folder, then KILL whatever of the run is left after `grace`
        seconds."""
        groups = [proc.pid for proc in self.live if proc.poll() is None]
        _signal_groups(groups, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            for proc in self.live:
                proc.poll()  # reaps an ended leader: a zombie still counts in its group
            if not any(map(_group_alive, groups)):
                break
            time.sleep(0.1)
        _signal_groups(groups, signal.SIGKILL)
        for proc in self.live:
            proc.wait()
        self.live.clear()

    def collect(self, started, timeout=900):
        """Wait for the started processes; return the records their ranks wrote."""
        records = []
        for proc, prefix in started:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                sys.exit(f"bench: a run took over {timeout} s and was stopped: "
                         f"{' '.join(proc.args)}")
            self.live.remove(proc)
            files = sorted(glob.glob(prefix + ".rank*.json"))
            if proc.returncode != 0 or not files:
                sys.exit(f"bench: a run failed (exit {proc.returncode}): "
                         f"{' '.join(proc.args)}\n{out[-3000:]}")
            for name in files:
                with open(name) as src:
                    records.append(json.load(src))
        return records


class Interrupted(Exception):
    """One of STOP_SIGNALS (TERM, INT, HUP) reached the bench."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def interrupt(signum, _frame):
    """A signal handler: stop the bench where it is. Later signals are ignored, so that a
    second Ctrl-C cannot cut short the clean-up of the first."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def measure_until_stopped(measure, results, name, json_path):
    """Call ``measure(folder, runs)`` in a scratch folder, every process with one OpenMP
    thread and this Python's tools first on PATH. A stop signal ends every run it started,
    says how many rows were measured (`results` already holds them in `json_path`) and
    exits with the signal's status."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for signum in STOP_SIGNALS:
        signal.signal(signum, interrupt)
    with tempfile.TemporaryDirectory() as folder:
        runs = Runs(folder, env)
        try:
            measure(folder, runs)
        except Interrupted as stop:
            runs.stop_all()
            print(f"{name}: stopped by {stop}: {len(results.rows)} rows measured, written to "
                  f"{json_path}", file=sys.stderr)
            sys.exit(stop.status)
        finally:
            runs.stop_all()


def hold_machine_lock():
    """One bench per machine: two at once share the cores and both measure nonsense.
    Returns the open lock file (the kernel drops the lock when this process ends)."""
    path = os.path.join(tempfile.gettempdir(), "hvdtrain-bench.lock")
    handle = open(path, "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        sys.exit(f"bench: another bench is running on this machine ({holder}); its figures "
                 "and this one's would both be wrong. Wait for it, or stop it.")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


def _usage_error(line):
    print(f"bench: {line}", file=sys.stderr)
    sys.exit(2)


class Results:
    """The figures so far, written to `path` after every row."""

    def __init__(self, path, steps, model):
        self.path = path
        self.rows = []
        self.allreduce = None
        self.images = []  # the input-pipeline rows (scripts/bench_images.py)
        self.counts = []  # the count exchange's cost (scripts/bench_step_counts.py)
        self.powersgd = []  # PowerSGD's own work, two processes at once (bench_powersgd.py)
        self.recipe = []  # the training recipe's options, paired, per image size (bench_recipe.py)
        self.small = []  # the small MLP's rows and its step's phases (bench_small.py)
        self.head = {"steps": steps, "model": model,
                     "load_average_at_start": os.getloadavg()[0]}

    def check_writable(self):
        """Create the file's folder and write the empty results now, so that a path that
        cannot be written fails before anything is measured."""
        if not os.path.basename(self.path) or os.path.isdir(self.path):
            _usage_error(f"--json {self.path!r} is not a file name")
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
        except FileExistsError:
            _usage_error(f"cannot create {folder} for --json: a file of that name is in "
                         "the way")
        except OSError as err:
            _usage_error(f"cannot create {folder} for --json: {err.strerror or err}")
        try:
            self.write(complete=False)
        except OSError as err:
            _usage_error(f"cannot write --json {self.path}: {err.strerror or err}")

    def add(self, row):
        self.rows.append(row)
        self.write(complete=False)

    def write(self, complete):
        temporary = self.path + ".tmp"
        try:
            with open(temporary, "w") as out:
                json.dump(dict(self.head, rows=self.rows, allreduce=self.allreduce,
                               counts=self.counts, powersgd=self.powersgd,
                               images=self.images, recipe=self.recipe, small=self.small,
                               complete=complete), out, indent=1)
            os.replace(temporary, self.path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
