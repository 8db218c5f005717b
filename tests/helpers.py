"""Helpers shared by unit and multi-process tests."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _write_horovodrun():
    """Write the suite's ``horovodrun`` (horovodrun_once.py: Horovod's, its build check asked
    once) into a folder of its own for this Python; return the folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.join(tempfile.gettempdir(), f"hvdtrain-test-bin-{os.getuid()}-" +
                          hashlib.sha1((os.path.realpath(sys.executable) + here).encode())
                          .hexdigest()[:12])
    script = (f"#!{sys.executable}\n"
              "# Written by tests/helpers.py: horovodrun for the test suite.\n"
              "import sys\n"
              f"sys.path.append({here!r})  # after Horovod's own modules\n"
              "from horovodrun_once import main\n"
              "if __name__ == '__main__':\n"
              f"    sys.exit(main({os.path.join(folder, 'build-answers.json')!r}))\n")
    path = os.path.join(folder, "horovodrun")
    try:
        with open(path) as src:
            if src.read() == script:
                return folder
    except OSError:
        pass
    os.makedirs(folder, exist_ok=True)
    with open(f"{path}.{os.getpid()}", "w") as out:
        out.write(script)
    os.chmod(out.name, 0o755)
    os.replace(out.name, path)  # several test processes write the same: each write is whole
    return folder


# Before BIN on the PATH of every command the tests start, and what tool("horovodrun") is.
SUITE_BIN = _write_horovodrun()


def tool(name):
    """Path of a console script installed beside this Python (hvdtrain, hvdtrain-launch), or
    of the suite's horovodrun (tests/horovodrun_once.py)."""
    return os.path.join(SUITE_BIN if name == "horovodrun" else BIN, name)


def job_path(path=None):
    """`path` (default: this process's PATH) with the suite's horovodrun and this Python's
    console scripts first."""
    path = os.environ.get("PATH", "") if path is None else path
    return os.pathsep.join([SUITE_BIN, BIN, path])


# The commands the running test started and their output (or the file it goes to): when the
# test fails, tests/conftest.py adds job_report() to its report, so a chance failure of a
# multi-process test shows what every process said.
_JOBS = []
TAIL_LINES = 100
# Launchers prefix each rank's lines: mpirun --tag-output "[1,0]<stderr>:", Gloo "[0]<stdout>:".
_RANK_PREFIX = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")


def record_job(cmd, output=None, path=None, routine=None):
    """Note a command this test started, with its `output` or the `path` it writes to.

    `routine`, a compiled pattern, matches progress lines (one per step) that would push a
    process's last words out of its tail in the report: they are counted, not shown."""
    _JOBS.append((list(map(str, cmd)), output, path, routine))


def clear_jobs():
    """Forget the recorded jobs, removing the output files they wrote to."""
    for _, _, path, _ in _JOBS:
        if path is not None and os.path.exists(path):
            os.remove(path)
    del _JOBS[:]


def split_by_process(output):
    """{"rank N" or "launcher": its lines} of a launcher's combined output."""
    parts = {}
    for line in output.splitlines():
        found = _RANK_PREFIX.match(line)
        who = f"rank {found.group(1)}" if found else "launcher"
        parts.setdefault(who, []).append(line[found.end():] if found else line)
    return parts


def job_report(lines=TAIL_LINES):
    """The last `lines` lines of each process of every job the current test started."""
    blocks = []
    for cmd, output, path, routine in _JOBS:
        if output is None and path is not None:
            try:
                with open(path, errors="replace") as src:
                    output = src.read()
            except OSError as err:
                output = f"(output file unreadable: {err})"
        blocks.append("$ " + " ".join(cmd)[:300])
        for who, part in sorted(split_by_process(output or "").items()):
            kept = [line for line in part if not (routine and routine.search(line))]
            shown = kept[-lines:]
            left_out = f", {len(part) - len(kept)} routine ones left out" if routine else ""
            blocks.append(f"--- {who}: last {len(shown)} of {len(part)} lines{left_out}")
            blocks.extend(shown)
    return "\n".join(blocks)


# How the suite starts a job: in a process group of its own (killed as one) but in the
# suite's session. With the kernel's autogroup scheduling (`sched_autogroup_enabled`, on by
# default in many kernels and on this VM) every session is a scheduling group of its own,
# with an equal share of the CPU whatever its threads' nice values: a waiting job's
# spinning thread, lowered to nice 19 (jobs.lower_priority_of_busy_threads), still took its
# session's share from the tests beside it (docs/development.md, "Jobs that mostly wait run
# beside the others"). No terminal input: a background process group that reads the
# terminal is stopped, and mpirun reads its standard input.
JOB_PROCESS_GROUP = {"process_group": 0, "stdin": subprocess.DEVNULL}


class StartedCommand:
    """A command running in its own process group, its output going to a temporary file
    (a pipe nobody reads would block a chatty job that runs beside others)."""

    def __init__(self, cmd, env=None, cwd=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["PATH"] = job_path(full_env.get("PATH", ""))
        self.cmd = cmd
        self._output = tempfile.TemporaryFile(mode="w+", errors="replace")
        self.proc = subprocess.Popen(cmd, stdout=self._output, stderr=subprocess.STDOUT,
                                     text=True, env=full_env, cwd=cwd or REPO,
                                     **JOB_PROCESS_GROUP)

    def finish(self, timeout):
        """Wait up to `timeout` s (then kill the group and fail); the CompletedProcess.

        The output is recorded for the failure report (:func:`job_report`)."""
        try:
            self.proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            self.kill()
            timed_out = True
        self._output.seek(0)
        out = self._output.read()
        self._output.close()
        record_job(self.cmd, out)
        if timed_out:
            pytest.fail(f"timed out after {timeout}s: {' '.join(map(str, self.cmd))}")
        return subprocess.CompletedProcess(self.cmd, self.proc.returncode, out, None)

    def kill(self):
        """SIGKILL the whole process group (if it still runs) and reap the launcher."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def run_command(cmd, timeout, env=None, cwd=None):
    """Run `cmd` in its own process group; on timeout kill the whole group and fail.

    A hung collective must fail the test, not block CI. The output is recorded for the
    failure report (:func:`job_report`).
    """
    return StartedCommand(cmd, env=env, cwd=cwd).finish(timeout)


def assert_arrays_close(a, b, tol=0.0, what=""):
    """Every element of array `a` within `tol` of `b` per unit of magnitude:
    ``|a - b| <= tol * max(1, |b|)``; ``tol=0`` means bit-identical.

    Absolute for values up to 1 (weights, gradients), relative above: BatchNorm's
    ``running_var`` reaches about 100, where float32's spacing is 7.6e-6, so a plain
    ``atol=1e-5`` is one or two roundings away from failing a correct run (it did, at
    3.05e-5 on a value of 97). A relative bound holds by construction for any magnitude.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert x.shape == y.shape, f"{what}: shape {x.shape} != {y.shape}"
    diff = np.abs(x - y)
    bad = diff > tol * np.maximum(1.0, np.abs(y))
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, diff, -1)), diff.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} of {diff.size} elements differ by more "
                             f"than {tol:g} per unit; worst {x[worst]!r} vs {y[worst]!r}")


def main_in_process(argv, capfd, main=None):
    """Run ``hvdtrain``'s ``cli.main(argv)`` (or another program's `main`, e.g.
    ``hvdtrain.report.plot.main``) in this process; return (exit status, the non-empty
    lines written to stdout and stderr, at the file-descriptor level).

    A refusal needs no new interpreter: this saves the seconds an ``hvdtrain`` process
    spends importing MXNet. Tests that the *whole process* prints one line (nothing from
    the interpreter's exit, no library warnings) keep a few real processes."""
    if main is None:
        from hvdtrain.cli import main
    capfd.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    captured = capfd.readouterr()
    return code, [l for l in (captured.out + captured.err).splitlines() if l.strip()]


def folder_digest(folder):
    """One hash over every file's path and bytes below `folder`: equal before and after
    means a refused command left the folder exactly as it was."""
    out = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            path = os.path.join(root, name)
            with open(path, "rb") as src:
                out.update(path.encode() + src.read())
    return out.hexdigest()


def timeline_runs(path):
    """Horovod's timeline at `path`, as {collective's name: [the phases of each time it
    ran, in order]}.

    The file is a Chrome trace that Horovod may leave without its closing bracket; each
    time a collective runs starts with its negotiation phase."""
    with open(path) as src:
        text = src.read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and "name" in e.get("args", {})}
    runs = {}
    for event in events:
        if event.get("ph") == "B":
            row = runs.setdefault(rows.get(event["pid"], "?"), [])
            if event["name"].startswith("NEGOTIATE_") or not row:
                row.append(set())
            row[-1].add(event["name"])
    return runs


def timeline_phases(path):
    """Horovod's timeline at `path`, as {collective's name: the phases it went through, in
    any of the times it ran}."""
    return {row: set().union(*seen) for row, seen in timeline_runs(path).items()}


def image_sets(root, per_class=None):
    """The generated digits image folder under `root`/images and its RecordIO pack under
    `root`/pack (made by ``hvdtrain-pack``, as docs/data.md shows), generated once per
    `root`. Returns (folder, pack)."""
    from hvdtrain.data.sample_images import write_digit_images
    folder, pack = os.path.join(root, "images"), os.path.join(root, "pack")
    if not os.path.isfile(os.path.join(pack, "val.idx")):
        write_digit_images(folder, per_class)
        proc = run_command([tool("hvdtrain-pack"), folder, pack], timeout=300)
        assert proc.returncode == 0, proc.stdout
    return folder, pack


def bad_copy(folder, pack, tmp_path):
    """A copy of the generated sets with one corrupt JPEG and one damaged record."""
    bad_folder, bad_pack = str(tmp_path / "images"), str(tmp_path / "pack")
    shutil.copytree(folder, bad_folder)
    shutil.copytree(pack, bad_pack)
    victim = sorted(os.listdir(os.path.join(bad_folder, "train", "digit3")))[0]
    path = os.path.join(bad_folder, "train", "digit3", victim)
    with open(path, "r+b") as out:  # a JPEG header followed by garbage
        out.seek(20)
        out.write(b"\x00" * 4000)
        out.truncate(400)
    from hvdtrain.data.images import read_idx
    keys, offsets = read_idx(os.path.join(bad_pack, "train.idx"))
    with open(os.path.join(bad_pack, "train.rec"), "r+b") as out:
        out.seek(int(offsets[7]))
        out.write(b"\xff" * 8)  # magic and length of record 7 gone
    return bad_folder, bad_pack, path, int(keys[7])


def class_subset(folder, out, classes, train_per_class=None):
    """A copy of image folder `folder` (train/ and val/) holding only `classes`, with at most
    `train_per_class` training images each (the first by name); returns `out`."""
    for split in ("train", "val"):
        for name in classes:
            files = sorted(os.listdir(os.path.join(folder, split, name)))
            if split == "train" and train_per_class is not None:
                files = files[:train_per_class]
            os.makedirs(os.path.join(out, split, name))
            for file in files:
                shutil.copy(os.path.join(folder, split, name, file),
                            os.path.join(out, split, name, file))
    return out
