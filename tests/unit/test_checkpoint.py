"""Checkpoints: round trip, pruning, resume resolution, and crashes at any moment of a save."""
import os
import random
import signal
import time

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain.state import checkpoint as ckpt
from hvdtrain.state import resume_from as resume
from hvdtrain.state.checkpoint import Checkpointer
from hvdtrain.state.checkpoint_files import CheckpointError, read_meta


def small_net(units=3):
    net = gluon.nn.Dense(units, in_units=4)
    net.initialize(mx.init.Uniform())
    return net


def trained(net):
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    for _ in range(2):
        with autograd.record():
            loss = net(mx.nd.ones((2, 4))).sum()
        loss.backward()
        trainer.step(2)
    return trainer


def test_round_trip_restores_parameters_and_optimizer_state(tmp_path):
    net = small_net()
    trainer = trained(net)
    path = ckpt.save_checkpoint(str(tmp_path), net, trainer, {"epoch": 1, "step": 2}, keep=3)
    assert path.endswith("checkpoints/epoch-0001")
    other = small_net()
    other_trainer = gluon.Trainer(other.collect_params(), "sgd",
                                  {"learning_rate": 0.1, "momentum": 0.9})
    meta = resume.restore(path, other, other_trainer, [mx.cpu()])
    assert (meta["epoch"], meta["step"]) == (1, 2)
    for a, b in zip(net.collect_params().values(), other.collect_params().values()):
        assert np.array_equal(a.data().asnumpy(), b.data().asnumpy())
    momenta = trainer._updaters[0].states  # pylint: disable=protected-access
    restored = other_trainer._updaters[0].states  # pylint: disable=protected-access
    assert momenta.keys() == restored.keys()
    for key in momenta:
        assert np.array_equal(momenta[key].asnumpy(), restored[key].asnumpy())


def test_latest_pointer_and_pruning(tmp_path):
    net = small_net()
    trainer = trained(net)
    saver = Checkpointer(str(tmp_path), every=2, keep=2, meta={"model": "dense"})

    class State:
        def __init__(self, epoch):
            self.epoch, self.step = epoch, epoch * 10

    saved = [saver.after_epoch(net, trainer, State(e), last=e == 5) for e in range(1, 6)]
    assert [bool(p) for p in saved] == [False, True, False, True, True]
    folder = tmp_path / "checkpoints"
    assert sorted(os.listdir(folder)) == ["epoch-0004", "epoch-0005", "latest"]
    assert resume.latest_checkpoint(str(tmp_path)).endswith("epoch-0005")
    assert read_meta(str(folder / "epoch-0005"))["model"] == "dense"
    assert Checkpointer(str(tmp_path), enabled=False).after_epoch(net, trainer, State(6)) is None


def test_resolve_resume(tmp_path):
    assert resume.resolve_resume(None, str(tmp_path)) == []
    assert resume.resolve_resume("auto", str(tmp_path)) == []  # nothing yet: start fresh
    with pytest.raises(CheckpointError, match="does not exist"):
        resume.resolve_resume(str(tmp_path / "nope"), None)
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        resume.resolve_resume(str(tmp_path), None)
    net = small_net()
    path = ckpt.save_checkpoint(str(tmp_path), net, trained(net), {"epoch": 3, "step": 9}, 3)
    for named in (("auto", str(tmp_path)), (str(tmp_path), None), (path, None)):
        found = resume.resolve_resume(*named)
        assert [c.path for c in found] == [path]
        assert (found[0].meta["epoch"], found[0].meta["step"]) == (3, 9)  # read from the file
    with open(os.path.join(path, "meta.json"), "w") as meta:
        meta.write("{truncated")
    with pytest.raises(CheckpointError, match="corrupt"):
        resume.resolve_resume(path, None)
    # The only checkpoint is damaged: refused, never silently started afresh over it.
    with pytest.raises(CheckpointError, match="no usable checkpoint: .* is incomplete or corr"):
        resume.resolve_resume("auto", str(tmp_path))


def test_restore_names_the_mismatching_parameter(tmp_path):
    net = small_net(units=3)
    path = ckpt.save_checkpoint(str(tmp_path), net, trained(net), {"epoch": 1, "step": 1}, 3)
    with pytest.raises(CheckpointError, match=r"weight has shape \(3, 4\) there, \(5, 4\) here"):
        resume.restore(path, small_net(units=5), None, [mx.cpu()])


def test_restore_refuses_a_corrupt_parameter_file(tmp_path):
    net = small_net()
    path = ckpt.save_checkpoint(str(tmp_path), net, trained(net), {"epoch": 1, "step": 1}, 3)
    params = os.path.join(path, "model.params")
    with open(params, "r+b") as out:
        out.truncate(os.path.getsize(params) // 2)
    with pytest.raises(CheckpointError, match="is corrupt"):
        resume.restore(path, small_net(), None, [mx.cpu()])


def test_restore_refuses_a_file_changed_in_place(tmp_path):
    """Bytes changed in place (the file's length and format intact, so MXNet would load it):
    the digest the save recorded in meta.json no longer matches, and restore says which
    file (a review's scrambled trainer.states resumed and trained to 0.1 accuracy)."""
    net = small_net()
    path = ckpt.save_checkpoint(str(tmp_path), net, trained(net), {"epoch": 1, "step": 1}, 3)
    states = os.path.join(path, "trainer.states")
    blob = bytearray(open(states, "rb").read())
    blob[-20:-10] = bytes(10)  # inside an array's data
    with open(states, "wb") as out:
        out.write(blob)
    with pytest.raises(CheckpointError, match="trainer.states changed since it was saved"):
        resume.restore(path, small_net(), trained(small_net()), [mx.cpu()])
    resume.restore(path, small_net(), None, [mx.cpu()])  # the parameters alone are intact


class FakeNet:
    """Writes a recognisable parameter file without MXNet (safe in a forked child)."""

    size = 256 * 1024

    def __init__(self, epoch):
        self.epoch = epoch

    def save_parameters(self, path):
        with open(path, "wb") as out:
            for _ in range(4):
                out.write(bytes([self.epoch % 256]) * (self.size // 4))

    def _collect_params_with_prefix(self):
        class Param:
            shape = (1,)
        return {"w": Param()}


class FakeTrainer:
    def save_states(self, path):
        with open(path, "wb") as out:
            out.write(b"states")


def assert_consistent(root):
    """Whatever a crash left, the newest checkpoint found is whole and matches its meta."""
    found = resume.latest_checkpoint(root)
    if found is None:
        return 0
    epoch = read_meta(found)["epoch"]
    with open(os.path.join(found, "model.params"), "rb") as src:
        data = src.read()
    assert data == bytes([epoch % 256]) * FakeNet.size, f"{found} is half-written"
    assert resume.resolve_resume("auto", root)[0].path == found
    return epoch


def crash_child(root, first_epoch, kill_on=None):
    """Fork a writer saving epochs from `first_epoch` on; it kills itself inside `kill_on`
    (a name in the checkpoint module's os) when given."""
    pid = os.fork()
    if pid:
        return pid
    try:
        if kill_on:
            real = getattr(ckpt.os, kill_on)

            def dying(*args, **kwargs):
                if "tmp" in str(args[0]) or kill_on == "replace":
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)
            setattr(ckpt.os, kill_on, dying)
        epoch = first_epoch
        while True:
            ckpt.save_checkpoint(root, FakeNet(epoch), FakeTrainer(), {"epoch": epoch,
                                                                      "step": epoch}, keep=2)
            epoch += 1
    finally:
        os._exit(1)


@pytest.mark.parametrize("stage", ["rename", "replace"])
def test_crash_between_temporary_write_and_rename_keeps_previous(tmp_path, stage):
    root = str(tmp_path)
    ckpt.save_checkpoint(root, FakeNet(1), FakeTrainer(), {"epoch": 1, "step": 1}, keep=2)
    pid = crash_child(root, 2, kill_on=stage)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    leftovers = os.listdir(os.path.join(root, "checkpoints"))
    assert any(e.startswith(".") for e in leftovers)  # the crash left a temporary behind
    # "rename": epoch 2 never got its name; "replace": it did, but `latest`, which moves
    # last, still names epoch 1. Either way epoch 1 is what a resume picks.
    assert assert_consistent(root) == 1
    ckpt.save_checkpoint(root, FakeNet(3), FakeTrainer(), {"epoch": 3, "step": 3}, keep=2)
    assert not [e for e in os.listdir(os.path.join(root, "checkpoints"))
                if e.startswith(".")]  # the next save cleans up


def test_crash_at_random_moments(tmp_path):
    rng = random.Random(0)
    root = str(tmp_path)
    newest = 0
    for attempt in range(60):
        pid = crash_child(root, newest + 1)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        epoch = assert_consistent(root)
        assert epoch >= newest  # a crash never loses the checkpoint that was complete
        newest = epoch
    assert newest > 0


@pytest.mark.parametrize("fails", ["rename", "prune"])
def test_a_synchronous_save_that_fails_after_writing_is_one_output_error(tmp_path,
                                                                         monkeypatch, fails):
    """A save written in the caller's thread (--elastic's) whose rename or prune fails
    (EIO) raises OutputError, the one line write_together turns into every rank's stop,
    never the bare OSError that would leave rank 0 alone; earlier checkpoints stay."""
    import errno
    from hvdtrain.state.writes import OutputError
    net = small_net()
    trainer = trained(net)
    saver = Checkpointer(str(tmp_path), every=1, keep=1)

    class State:
        epoch, step = 1, 10
    first = saver.after_epoch(net, trainer, State())
    real_rename = os.rename

    def failing(src, dst):
        gone = fails == "rename" and os.path.basename(src).startswith(".tmp-") or \
            fails == "prune" and os.path.basename(dst).startswith(".old-")
        if gone:
            raise OSError(errno.EIO, "Input/output error")
        return real_rename(src, dst)
    monkeypatch.setattr(os, "rename", failing)
    State.epoch, State.step = 2, 20
    with pytest.raises(OutputError, match="Input/output error"):
        saver.after_epoch(net, trainer, State())
    monkeypatch.setattr(os, "rename", real_rename)
    assert os.path.isdir(first) and read_meta(first)["step"] == 10
    leftovers = [n for n in os.listdir(os.path.dirname(first)) if n.startswith(".tmp-")]
    assert not leftovers
