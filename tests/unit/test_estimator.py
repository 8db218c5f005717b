"""hvdtrain.Estimator in one process, against a plain Gluon loop written here: a user's
regression model trains as the loop does, its metrics are the whole split's per element, a
stop and resume inside an epoch ends where an uninterrupted run ends, a sample the dataset
cannot read is left out as the loop leaves it out, and each kind of bad input is refused in
one line. (Several ranks: tests/dist/test_estimator_models.py.)"""
import itertools
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain import BadSample, ConfigError, DeviceLoss, RunConfig, TrainConfig
from hvdtrain.estimator import BatchProcessor, Estimator

FEATURES, TRAIN, VAL, BATCH, LR = 5, 40, 22, 8, 0.05
ONE_PROCESS = dict(kvstore="none", log_interval=0)


def data(count, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, FEATURES)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]).astype(np.float32)
    return x, y


def make_net(seed=7):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(1))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, FEATURES)))
    return net


def arrays(net):
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def estimator_for(net, metrics=None, **options):
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": 0.9})
    return Estimator(net, gluon.loss.L2Loss(), train_metrics=metrics or [mx.metric.RMSE()],
                     trainer=trainer, context=mx.cpu(), **dict(ONE_PROCESS, **options))


def plain_loop(start, epochs, train, skip=()):
    """The reference: a plain Gluon Trainer over the training samples in order (but those
    in `skip`), BATCH positions a step; returns (its arrays, the predictions of the last
    epoch, their labels)."""
    net = make_net()
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(start[name]))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": 0.9})
    loss_fn = gluon.loss.L2Loss()
    x, y = train
    for _ in range(epochs):
        preds, labels = [], []
        for first in range(0, len(x), BATCH):
            index = [i for i in range(first, min(first + BATCH, len(x))) if i not in skip]
            xs, ys = mx.nd.array(x[index]), mx.nd.array(y[index])
            with autograd.record():
                pred = net(xs)
                loss = loss_fn(pred, ys)
            loss.backward()
            trainer.step(len(index))
            preds.append(pred.asnumpy())
            labels.append(ys.asnumpy())
    return arrays(net), np.concatenate(preds), np.concatenate(labels)


def rmse(pred, label):
    return float(np.sqrt(((pred.reshape(-1) - label.reshape(-1)) ** 2).mean()))


def test_a_regression_model_trains_as_a_plain_gluon_loop_and_reports_per_element():
    train, val = data(TRAIN, 1), data(VAL, 2)
    net = make_net()
    start = arrays(net)
    estimator = estimator_for(net)
    estimator.fit(gluon.data.DataLoader(gluon.data.ArrayDataset(*train), batch_size=BATCH),
                  val_data=gluon.data.DataLoader(gluon.data.ArrayDataset(*val), batch_size=6),
                  epochs=2)
    want, preds, labels = plain_loop(start, 2, train)
    for name, value in want.items():
        np.testing.assert_allclose(arrays(net)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    train_rmse, val_rmse = (m.get()[1] for m in estimator.train_metrics + estimator.val_metrics
                            if isinstance(m, mx.metric.RMSE))
    assert train_rmse == pytest.approx(rmse(preds, labels), abs=1e-5)
    # Over all 22 samples per element, not MXNet's mean of the 4 batches' RMSEs (6, 6, 6, 4).
    assert val_rmse == pytest.approx(rmse(net(mx.nd.array(val[0])).asnumpy(), val[1]),
                                     abs=1e-5)
    assert estimator.val_count == VAL


def test_a_loss_metric_is_given_the_losses():
    """DeviceLoss (the command's test_loss) is a Loss metric: the handlers pass it the
    losses, not the predictions."""
    train, val = data(TRAIN, 1), data(VAL, 2)
    net = make_net()
    estimator = Estimator(net, gluon.loss.L2Loss(), val_metrics=[DeviceLoss()], context=mx.cpu(),
                          trainer=gluon.Trainer(net.collect_params(), "sgd",
                                                {"learning_rate": LR}), **ONE_PROCESS)
    estimator.fit(gluon.data.ArrayDataset(*train), val_data=gluon.data.ArrayDataset(*val),
                  epochs=1)
    want = gluon.loss.L2Loss()(net(mx.nd.array(val[0])), mx.nd.array(val[1])).asnumpy().mean()
    assert estimator.val_metrics[0].get()[1] == pytest.approx(float(want), rel=1e-5)


def test_a_stop_inside_an_epoch_resumes_where_an_uninterrupted_run_ends(tmp_path):
    train = gluon.data.ArrayDataset(*data(TRAIN, 1))
    loader = lambda: gluon.data.DataLoader(train, batch_size=BATCH, shuffle=True)  # noqa: E731
    whole = make_net()
    estimator_for(whole).fit(loader(), epochs=3)
    stopped = make_net()
    estimator_for(stopped, output_dir=str(tmp_path), max_steps=7).fit(loader(), epochs=3)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-2]["event"] == "stop" and records[-2]["step"] == 7  # in epoch 2 of 3
    resumed = make_net(seed=99)  # other weights: the checkpoint's must replace them
    estimator_for(resumed, output_dir=str(tmp_path), resume="auto").fit(loader(), epochs=3)
    for name, value in arrays(whole).items():
        np.testing.assert_array_equal(arrays(resumed)[name], value, err_msg=name)
    assert (tmp_path / "model.params").exists()


class SomeUnreadable(gluon.data.Dataset):
    """The documented protocol: a sample that cannot be read raises BadSample."""

    def __init__(self, x, y, bad):
        self.x, self.y, self.bad = x, y, set(bad)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if index in self.bad:
            raise BadSample(f"sample {index}: unreadable")
        return self.x[index], self.y[index]


def test_samples_a_dataset_cannot_read_are_left_out_as_a_plain_loop_leaves_them_out(caplog):
    train = data(TRAIN, 1)
    net = make_net()
    start = arrays(net)
    estimator = estimator_for(net, max_bad_samples="2")
    estimator.fit(gluon.data.DataLoader(SomeUnreadable(*train, bad=[3, 17]), batch_size=BATCH),
                  epochs=1)
    want, _, _ = plain_loop(start, 1, train, skip={3, 17})
    for name, value in want.items():
        np.testing.assert_allclose(arrays(net)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert "sample 17: unreadable" in caplog.text
    with pytest.raises(ConfigError, match="sample 3: unreadable"):  # past the limit of 1
        estimator_for(make_net(), max_bad_samples="1").fit(
            gluon.data.DataLoader(SomeUnreadable(*train, bad=[3, 17]), batch_size=BATCH),
            epochs=1)


class MeanLoss(BatchProcessor):
    """A fit_batch that averages the loss over the batch itself."""

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        data_, label, pred, loss = super().fit_batch(estimator, train_batch, batch_axis)
        return data_, label, pred, [l.mean() for l in loss]


class OneLabelShort(BatchProcessor):
    def evaluate_batch(self, estimator, val_batch, batch_axis=0):
        data_, label, pred, loss = super().evaluate_batch(estimator, val_batch, batch_axis)
        return data_, label[:0], pred, loss


def refusal(make, fit=None):
    """The one-line message of the error `make()` (then `fit(estimator)`) raises."""
    with pytest.raises(ValueError) as raised:
        estimator = make()
        if fit is not None:
            fit(estimator)
    message = str(raised.value)
    assert "\n" not in message
    return message


class Endless:
    """A batch sampler that says it has 3 batches and never ends."""

    def __len__(self):
        return 3

    def __iter__(self):
        return itertools.repeat([0, 1])


def test_bad_input_is_refused_in_one_line():
    train = gluon.data.ArrayDataset(*data(TRAIN, 1))
    net = make_net()
    fit = lambda e: e.fit(gluon.data.DataLoader(train, batch_size=BATCH), epochs=1)  # noqa: E731
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR})
    assert "loss must be a Loss" in refusal(lambda: Estimator(net, "mse", context=mx.cpu(),
                                                              **ONE_PROCESS))
    assert "metrics must be a Metric" in refusal(
        lambda: Estimator(net, gluon.loss.L2Loss(), train_metrics="rmse", context=mx.cpu(),
                          **ONE_PROCESS))
    assert "pearsonr" in refusal(lambda: Estimator(  # its running moments are not merged
        net, gluon.loss.L2Loss(), context=mx.cpu(),
        train_metrics=mx.metric.PearsonCorrelation(average="micro"), **ONE_PROCESS))
    assert "no option 'mixup'" in refusal(lambda: estimator_for(net, mixup=0.2))
    assert "lr, label_smoothing" in refusal(lambda: Estimator(
        net, gluon.loss.L2Loss(), trainer=trainer, context=mx.cpu(),
        config=TrainConfig(dataset="digits", lr=0.5, label_smoothing=0.1, kvstore="none")))
    assert "mean" in refusal(lambda: Estimator(
        net, gluon.loss.L2Loss(), trainer=trainer, context=mx.cpu(),
        batch_processor=MeanLoss(), **ONE_PROCESS), fit)
    assert "0 label, 1 prediction and 1 loss" in refusal(lambda: Estimator(
        make_net(), gluon.loss.L2Loss(), context=mx.cpu(), batch_processor=OneLabelShort(),
        **ONE_PROCESS), lambda e: e.fit(train, val_data=train, epochs=1))
    # Any batch sampler trains (tests/unit/test_batch_shards.py), but not one with no end.
    endless = gluon.data.DataLoader(train, batch_sampler=Endless())
    assert "whose epoch ends after len() batches" in refusal(
        lambda: estimator_for(make_net()), lambda e: e.fit(endless, epochs=1))
    assert "rollover" in refusal(lambda: estimator_for(make_net()), lambda e: e.fit(
        gluon.data.DataLoader(train, batch_size=BATCH, last_batch="rollover"), epochs=1))
    assert "DataLoader" in refusal(lambda: estimator_for(make_net()), lambda e: e.fit(
        mx.io.NDArrayIter(*data(TRAIN, 1), batch_size=BATCH), epochs=1))


def test_a_run_config_and_keywords_set_the_same_fields():
    net = make_net()
    assert estimator_for(net, accumulate=2).config.accumulate == 2
    estimator = Estimator(net, gluon.loss.L2Loss(), context=mx.cpu(),
                          config=RunConfig(accumulate=3, kvstore="none"), accumulate=4)
    assert estimator.config.accumulate == 4  # the keyword wins


def test_a_store_given_must_agree_with_the_wire_the_settings_ask_for():
    """A program that makes its own store and asks for float16 gradients gets them, or a
    refusal: a float32 store is not silently kept (TrainConfig(fp16_allreduce=True) and
    create_store('horovod') once left the wire at float32)."""
    from hvdtrain import create_store
    net = make_net()
    with pytest.raises(ConfigError, match="compression='fp16'"):
        Estimator(net, gluon.loss.L2Loss(), context=mx.cpu(), fp16_allreduce=True,
                  store=create_store("horovod"))
    estimator = Estimator(net, gluon.loss.L2Loss(), context=mx.cpu(), fp16_allreduce=True,
                          store=create_store("horovod", compression="fp16"))
    assert estimator.dist.store.compression == "fp16"


def test_a_setting_the_estimator_would_ignore_is_refused_and_the_records_say_the_real_one(
        tmp_path):
    """A DataLoader's batch size is the one trained with: a batch_size beside it that
    differs would be ignored (refused), and metrics.jsonl records the loader's, not the
    default 64; fit's epochs says how long to train (an epochs setting is refused)."""
    train = gluon.data.ArrayDataset(*data(TRAIN, 1))
    loader = gluon.data.DataLoader(train, batch_size=BATCH)
    assert "batch_size=16, but the DataLoader" in refusal(
        lambda: estimator_for(make_net(), batch_size=16), lambda e: e.fit(loader, epochs=1))
    assert "fit(train_data, epochs=N)" in refusal(lambda: estimator_for(make_net(), epochs=3))
    estimator_for(make_net(), output_dir=str(tmp_path)).fit(loader, epochs=1)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["config"]["batch_size"] == BATCH
    assert all(r["batch_size"] == BATCH for r in records if r["event"] == "epoch")


def test_refusals_name_the_estimators_keywords_not_the_commands_flags(tmp_path):
    """The run folder's refusals are the command's; a program hears them in its keywords."""
    train = gluon.data.ArrayDataset(*data(TRAIN, 1))
    message = refusal(lambda: estimator_for(make_net(), resume="auto"),
                      lambda e: e.fit(train, epochs=1))
    assert "resume='auto'" in message and "output_dir" in message and "--" not in message


def test_an_uncaught_refusal_ends_a_program_with_one_line_and_exit_2(tmp_path):
    """A program that does not catch the Estimator's refusal (a loss that is not a Gluon
    loss) ends with one line and exit status 2, as the command does; not a traceback."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    program = tmp_path / "mine.py"
    program.write_text("import mxnet as mx\nfrom mxnet import gluon\n"
                       "from hvdtrain.estimator import Estimator\n"
                       "Estimator(gluon.nn.Dense(1), 'mse', context=mx.cpu(), kvstore='none')\n")
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["mine.py: error: loss must be a Loss, refer to gluon.loss.Loss:mse"], lines
