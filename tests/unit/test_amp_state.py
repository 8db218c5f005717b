"""AMP's dynamic loss scale travels with the checkpoint.

AMP itself runs only on GPUs (MXNet 1.9.1 has no float16 CPU kernels), so this checks the
save and restore of MXNet's own LossScaler around a CPU trainer; a GPU host runs the rest.
"""
import mxnet as mx
from mxnet import gluon
from mxnet.contrib.amp.loss_scaler import LossScaler

from hvdtrain.state import loss_scale
from hvdtrain.state.checkpoint import Checkpointer
from hvdtrain.state.checkpoint_files import read_meta
from hvdtrain.config import TrainConfig
from hvdtrain.store.dist import DistContext
from hvdtrain.loop.run.outputs import build_checkpointer
from hvdtrain.state.train_state import TrainState


def amp_trainer():
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize(mx.init.Uniform())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    trainer._amp_loss_scaler = LossScaler()  # what amp.init_trainer attaches
    return net, trainer


def test_loss_scale_is_saved_and_restored(tmp_path):
    net, trainer = amp_trainer()
    scaler = trainer._amp_loss_scaler
    scaler._loss_scale, scaler._next_loss_scale, scaler._unskipped = 2.0 ** 9, 2.0 ** 8, 17
    saver = build_checkpointer(TrainConfig(dataset="digits", output_dir=str(tmp_path)),
                               DistContext(), 8)
    path = saver.after_epoch(net, trainer, TrainState(epoch=1, step=40), last=True)
    assert saver.wait() == path  # the job's checkpointer writes in the background
    meta = read_meta(path)
    _, resumed = amp_trainer()
    loss_scale.restore_loss_scale(resumed, meta)
    restored = resumed._amp_loss_scaler
    assert (restored.loss_scale, restored._next_loss_scale, restored._unskipped) == \
        (2.0 ** 9, 2.0 ** 8, 17)


def test_without_amp_nothing_is_saved(tmp_path):
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    saver = Checkpointer(str(tmp_path))
    saver.extra = loss_scale.loss_scale_state
    meta = read_meta(saver.after_epoch(net, trainer, TrainState(epoch=1, step=1), last=True))
    assert "amp_loss_scaler" not in meta
    loss_scale.restore_loss_scale(trainer, meta)  # no scaler: nothing to do
