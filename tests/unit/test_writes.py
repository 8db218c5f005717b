"""Outputs that cannot be written: unusable folders refused up front; a full disk during a
checkpoint or a metrics line is one error naming the path, with nothing half-written left."""
import errno
import json
import os
import subprocess

import pytest

from hvdtrain.state import checkpoint as ckpt
from hvdtrain.report import log as logmod
from hvdtrain.state.resume_from import latest_checkpoint
from hvdtrain.config import ConfigError
from hvdtrain.report.log import MetricsWriter
from hvdtrain.state.writes import OutputError, check_writable_dir, write_failure
from test_checkpoint import small_net, trained


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (needs root; skipped where mounting is not allowed)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_unusable_folders_are_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=f"^--tensorboard {afile} is a file, not a folder$"):
        check_writable_dir(str(afile), "--tensorboard")
    with pytest.raises(ConfigError, match="^--tensorboard /proc/x is not writable"):
        check_writable_dir("/proc/x", "--tensorboard")
    check_writable_dir(str(tmp_path / "new" / "tb"), "--tensorboard")
    assert os.listdir(tmp_path / "new" / "tb") == []


def test_full_disk_during_a_checkpoint_keeps_the_previous_and_removes_the_temporary(
        tmp_path, monkeypatch):
    net = small_net()
    trainer = trained(net)
    first = ckpt.save_checkpoint(str(tmp_path), net, trainer, {"epoch": 1, "step": 2}, keep=3)
    monkeypatch.setattr(trainer, "save_states", _no_space)
    with pytest.raises(OutputError, match=r"^cannot write .*/checkpoints/\.tmp-epoch-0002-\d+: "
                                          r"no space left on device$"):
        ckpt.save_checkpoint(str(tmp_path), net, trainer, {"epoch": 2, "step": 4}, keep=3)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0001", "latest"]
    assert latest_checkpoint(str(tmp_path)) == first


def test_full_disk_during_a_metrics_line_leaves_no_half_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(str(path))
    writer.write("start", epoch=0)
    before = path.read_bytes()
    monkeypatch.setattr(logmod.os, "fsync", _no_space)
    with pytest.raises(OutputError, match=f"^cannot write {path}: no space left on device$"):
        writer.write("epoch", epoch=0, test_acc=0.5)
    assert path.read_bytes() == before
    assert [json.loads(l)["event"] for l in path.read_text().splitlines()] == ["start"]


def test_a_real_full_disk_under_mxnet_is_named(tiny_disk):
    """MXNet reports a short write as 'FileStream.Write incomplete', without errno: the
    free space tells it apart."""
    from mxnet import gluon
    net = gluon.nn.Dense(200, in_units=1000)
    net.initialize()
    with pytest.raises(OutputError, match="no space left on device"):
        ckpt.save_params(net, str(tiny_disk / "model.params"))
    assert os.listdir(tiny_disk) == []


def test_other_failures_keep_their_last_line(tmp_path):
    other = write_failure(str(tmp_path / "x"), RuntimeError("line one\nsomething else"))
    assert str(other) == f"cannot write {tmp_path / 'x'}: something else"
    denied = write_failure(str(tmp_path / "x"), PermissionError(errno.EACCES, "Permission denied"))
    assert str(denied) == f"cannot write {tmp_path / 'x'}: Permission denied"
