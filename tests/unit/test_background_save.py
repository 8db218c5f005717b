"""Checkpoints written in the background from a host copy: the same files as Gluon's own save,
training free to change the model meanwhile, and a write that fails or is killed leaving the
previous checkpoint the one a resume takes."""
import errno
import os
import signal
import subprocess
import sys
import threading
import time

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from helpers import REPO
from hvdtrain.loop.run.boundary import host_copy
from hvdtrain.state import checkpoint as ckpt
from hvdtrain.state.background import HostCopy
from hvdtrain.state.checkpoint import Checkpointer
from hvdtrain.state.resume_from import latest_checkpoint, resolve_resume
from hvdtrain.state.train_state import TrainState
from hvdtrain.state.writes import OutputError


OPTIMIZERS = {"sgd": {"learning_rate": 0.1, "momentum": 0.9},  # one state array a parameter
              "adam": {"learning_rate": 0.01}}  # two (a tuple)


def trained_bn_net(optimizer="sgd"):
    """A net with BatchNorm (running statistics no gradient reaches) and an optimizer with
    state, after two steps."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(4, in_units=3), gluon.nn.BatchNorm(in_channels=4),
            gluon.nn.Dense(2, in_units=4))
    net.initialize(mx.init.Uniform())
    trainer = gluon.Trainer(net.collect_params(), optimizer, OPTIMIZERS[optimizer])
    train_step(net, trainer)
    train_step(net, trainer)
    return net, trainer


def train_step(net, trainer):
    with autograd.record():
        loss = net(mx.nd.array(np.arange(12).reshape(4, 3) / 12.0)).sum()
    loss.backward()
    trainer.step(4)
    mx.nd.waitall()


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_background_save_writes_the_bytes_gluon_writes(optimizer, tmp_path, monkeypatch):
    """What Gluon writes at the save, though training changed the parameters, the optimizer
    states and the update counts before the write ran."""
    net, trainer = trained_bn_net(optimizer)
    # The reference: Gluon's own files, written before the background save starts.
    net.save_parameters(str(tmp_path / "gluon.params"))
    trainer.save_states(str(tmp_path / "gluon.states"))
    trained_on = threading.Event()
    write = HostCopy.save_parameters
    monkeypatch.setattr(HostCopy, "save_parameters",
                        lambda self, path: trained_on.wait(60) and write(self, path))
    saver = Checkpointer(str(tmp_path / "run"), host_copy=host_copy)
    path = saver.after_epoch(net, trainer, TrainState(epoch=1, step=2), last=True)
    train_step(net, trainer)  # training goes on before the copy is written
    trained_on.set()
    assert saver.wait() == path
    assert (tmp_path / "gluon.params").read_bytes() == open(f"{path}/model.params", "rb").read()
    assert (tmp_path / "gluon.states").read_bytes() == open(f"{path}/trainer.states", "rb").read()
    assert resolve_resume("auto", str(tmp_path / "run"))[0].path == path


def test_a_save_inside_an_epoch_can_write_other_running_statistics(tmp_path):
    """A mid-epoch save writes the running statistics averaged over the ranks while each
    rank trains on with its own (loop/run/boundary.py): `replace` takes their place in the file
    only."""
    net, trainer = trained_bn_net()
    name = [n for n in net._collect_params_with_prefix() if n.endswith("running_mean")][0]
    own = net._collect_params_with_prefix()[name].data().asnumpy()
    saver = Checkpointer(str(tmp_path), host_copy=host_copy)
    saver.save(net, trainer, TrainState(epoch=0, step=2, epoch_samples=8),
               {name: mx.nd.full((4,), 7.0)})
    path = saver.wait()
    assert path.endswith("epoch-0000-step-0000002")
    assert np.array_equal(mx.nd.load(f"{path}/model.params")[name].asnumpy(), np.full(4, 7.0))
    assert np.array_equal(net._collect_params_with_prefix()[name].data().asnumpy(), own)


def test_a_full_disk_during_the_background_write_keeps_the_previous_checkpoint(tmp_path,
                                                                               monkeypatch):
    net, trainer = trained_bn_net()
    saver = Checkpointer(str(tmp_path), host_copy=host_copy)
    first = saver.after_epoch(net, trainer, TrainState(epoch=1, step=2), last=True)
    saver.wait()

    def full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(HostCopy, "save_parameters", full)
    saver.after_epoch(net, trainer, TrainState(epoch=2, step=4), last=True)
    deadline = time.monotonic() + 30
    while saver.writing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert saver.failed  # what rank 0 votes at the next step boundary
    with pytest.raises(OutputError, match=r"cannot write .*/checkpoints/\.tmp-epoch-0002-\d+: "
                                          r"no space left on device"):
        saver.wait()
    assert not saver.failed and saver.wait() is None  # raised once
    assert latest_checkpoint(str(tmp_path)) == first
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0001", "latest"]


KILLED_WRITER = """
import os, sys, time
sys.path[:0] = [{repo!r}, {repo!r} + "/tests", {tests!r}]
from test_background_save import trained_bn_net
from hvdtrain.loop.run.boundary import host_copy
from hvdtrain.state import checkpoint as ckpt
from hvdtrain.state.background import HostCopy
from hvdtrain.state.checkpoint import Checkpointer
from hvdtrain.state.train_state import TrainState
net, trainer = trained_bn_net()
saver = Checkpointer({out!r}, host_copy=host_copy)
saver.after_epoch(net, trainer, TrainState(epoch=1, step=2), last=True)
saver.wait()
write = HostCopy.save_parameters
def slow(self, path):  # storage that takes long: killed in the middle of the write
    with open(path, "wb") as out:
        out.write(b"half")
    print("writing", flush=True)
    time.sleep(3600)
HostCopy.save_parameters = slow
saver.after_epoch(net, trainer, TrainState(epoch=2, step=4), last=True)
time.sleep(3600)  # training would go on here
"""


def test_sigkill_during_the_background_write_keeps_the_previous_checkpoint(tmp_path):
    out = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER.format(
        repo=REPO, tests=os.path.dirname(os.path.abspath(__file__)), out=str(out))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
    folder = out / "checkpoints"
    assert [e for e in os.listdir(folder) if e.startswith(".tmp-epoch-0002")]  # cut short
    assert latest_checkpoint(str(out)) == str(folder / "epoch-0001")
    assert ckpt.clear_leftovers(str(folder))  # the next start removes it
    assert sorted(os.listdir(folder)) == ["epoch-0001", "latest"]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_optimizer_state_copies_live_in_host_memory(optimizer, tmp_path):
    """A model on a device (mx.cpu(1) stands in for a GPU): the optimizer state a background
    save copies goes to the CPU, not beside training's in the device's memory, and loads
    back into the trainer as Gluon's own save does."""
    from hvdtrain.store.gluon_internals import optimizer_states_later
    device = mx.cpu(1)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(4, in_units=3), gluon.nn.Dense(2, in_units=4))
    net.initialize(mx.init.Uniform(), ctx=device)
    trainer = gluon.Trainer(net.collect_params(), optimizer, OPTIMIZERS[optimizer])
    for _ in range(2):
        with autograd.record():
            loss = net(mx.nd.array(np.arange(12).reshape(4, 3) / 12.0, ctx=device)).sum()
        loss.backward()
        trainer.step(4)
    later = optimizer_states_later(trainer)
    copies = [array for state in later.states.values()
              for array in (state if isinstance(state, (tuple, list)) else (state,))
              if isinstance(array, mx.nd.NDArray)]
    assert copies and {a.context for a in copies} == {mx.cpu()}
    assert {s.context for s in trainer._updaters[0].states.values()  # pylint: disable=protected-access
            if isinstance(s, mx.nd.NDArray)} <= {device}
    gluon_file = str(tmp_path / "gluon.states")
    trainer.save_states(gluon_file)
    ours = str(tmp_path / "ours.states")
    with open(ours, "wb") as out:
        out.write(later())
    reference = gluon.Trainer(net.collect_params(), optimizer, OPTIMIZERS[optimizer])
    reference.load_states(gluon_file)
    trainer.load_states(ours)
    for index, state in reference._updaters[0].states.items():  # pylint: disable=protected-access
        mine = trainer._updaters[0].states[index]  # pylint: disable=protected-access
        for a, b in zip(*(s if isinstance(s, (tuple, list)) else (s,) for s in (state, mine))):
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
