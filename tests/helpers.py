"""Helpers shared by unit and multi-process tests."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def tool(name):
    """Path of a console script installed beside this Python (horovodrun, hvdtrain)."""
    return os.path.join(BIN, name)


def run_command(cmd, timeout, env=None, cwd=None):
    """Run `cmd` in its own process group; on timeout kill the whole group and fail.

    A hung collective must fail the test, not block CI.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PATH"] = BIN + os.pathsep + full_env.get("PATH", "")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=cwd or REPO, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


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


def timeline_phases(path):
    """Horovod's timeline at `path`, as {collective's name: the phases it went through}.

    The file is a Chrome trace that Horovod may leave without its closing bracket."""
    with open(path) as src:
        text = src.read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and "name" in e.get("args", {})}
    phases = {}
    for event in events:
        if event.get("ph") == "B":
            phases.setdefault(rows.get(event["pid"], "?"), set()).add(event["name"])
    return phases


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
