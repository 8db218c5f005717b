"""--ema against a NumPy running average of the model's arrays saved after every step.

The model is bn_cnn, hybridized with a static graph: its BatchNorm running statistics are
written by the backward pass without MXNet's engine knowing (docs/training.md), the case
where an average read at the wrong moment takes the previous step's statistics."""
import json

import mxnet as mx
import numpy as np
import pytest

from hvdtrain import job
from hvdtrain.config import TrainConfig
from hvdtrain.data.load import load_dataset
from hvdtrain.loop.recipe.ema import WeightAverage
from hvdtrain.loop.elastic.state import GluonState
from hvdtrain.models import build_model

RUN = dict(dataset="digits", no_cuda=True, kvstore="none", model="bn_cnn", batch_size=64,
           lr=0.1, log_interval=0, progress=False, seed=1)


def arrays(net):
    mx.nd.waitall()  # the statistics are written outside the engine's knowledge
    return {n: p.data().asnumpy().astype(np.float64)
            for n, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def recorded_run(monkeypatch, **flags):
    """A run of RUN + `flags`; returns it, the model's arrays when the average started and
    after every optimizer step."""
    start, steps = [], []
    real_init, real_update = WeightAverage.__init__, WeightAverage.update

    def init(self, net, *args, **kwargs):
        real_init(self, net, *args, **kwargs)
        self.net_for_test = net
        start.append(arrays(net))

    def update(self, step):
        done = real_update(self, step)  # queued first: the read under test is the average's
        steps.append(arrays(self.net_for_test))
        return done

    monkeypatch.setattr(WeightAverage, "__init__", init)
    monkeypatch.setattr(WeightAverage, "update", update)
    run = job.train(TrainConfig(**RUN, **flags))
    return run, start[0], steps


def numpy_average(start, steps, decay, every=1, warmup=0):
    """torchvision's: the model itself through the warm-up's `warmup` steps, then every
    `every` steps ``ema = d * ema + (1 - d) * model`` with ``d = decay ** every``."""
    ema = dict(start)
    for number, values in enumerate(steps, 1):
        if number % every == 0:
            kept = 0.0 if number <= warmup else decay ** every
            ema = {n: kept * ema[n] + (1 - kept) * values[n] for n in ema}
    return ema


def assert_close(ours, want, rtol=2e-5):
    assert sorted(ours) == sorted(want)
    for name in want:
        np.testing.assert_allclose(ours[name], want[name], rtol=rtol, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("every,warmup_epochs,warmup", [(1, 0, 0), (3, 0, 0), (1, 0.5, 12)])
def test_the_average_is_numpys_running_average_of_every_array(monkeypatch, tmp_path, every,
                                                              warmup_epochs, warmup):
    run, start, steps = recorded_run(monkeypatch, epochs=2, ema=0.8, ema_every=every,
                                     warmup_epochs=warmup_epochs, output_dir=str(tmp_path))
    assert len(steps) == 2 * 23  # 1437 samples at 64: 23 steps an epoch (warm-up: 11.5)
    want = numpy_average(start, steps, 0.8, every, warmup)
    assert any(n.endswith("running_var") for n in want)
    assert_close(run.ema.state(), want)
    saved = {n: a.asnumpy() for n, a in mx.nd.load(str(tmp_path / "model-ema.params")).items()}
    assert_close(saved, want)
    # The average moved away from the model, and the running statistics with it.
    last = steps[-1]
    assert max(np.abs(want[n] - last[n]).max() for n in want if "running" in n) > 1e-3


def evaluate_file(path):
    """Test accuracy of the parameters in `path`, scored here by a fresh imperative bn_cnn."""
    data = load_dataset("digits")
    net = build_model("bn_cnn", 10)
    net.load_parameters(path)
    scores = net(mx.nd.array(data.test_x)).asnumpy()
    return float((scores.argmax(axis=1) == data.test_y).mean())


def test_the_average_is_evaluated_beside_the_model_and_saved(tmp_path, capfd):
    run = job.train(TrainConfig(**RUN, epochs=2, ema=0.9, output_dir=str(tmp_path)))
    # The run's summary gives both figures and names the average's file.
    summary = capfd.readouterr().err.split("run summary")[-1]
    assert "EMA test accuracy" in summary and str(tmp_path / "model-ema.params") in summary
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert all({"test_acc", "ema_test_acc", "ema_test_top5", "ema_test_loss"} <= set(r)
               for r in epochs)
    assert records[-1]["ema_test_acc"] == epochs[-1]["ema_test_acc"] == \
        run.result["ema_test_acc"]
    # Each figure is the model it names: scored again, independently, from the saved files.
    assert epochs[-1]["ema_test_acc"] == pytest.approx(
        evaluate_file(str(tmp_path / "model-ema.params")), abs=1.5 / 360)
    assert epochs[-1]["test_acc"] == pytest.approx(
        evaluate_file(str(tmp_path / "model.params")), abs=1.5 / 360)
    checkpoint = tmp_path / "checkpoints" / "epoch-0002"
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta["files"] == ["ema.params"] and meta["ema"]["decay"] == 0.9
    assert (checkpoint / "ema.params").read_bytes() == \
        (tmp_path / "model-ema.params").read_bytes()


def saved(path):
    return {n: a.asnumpy() for n, a in mx.nd.load(str(path)).items()}


def test_a_resumed_run_continues_the_average_exactly(tmp_path):
    """Stopped at step 30 (inside epoch 2) and resumed: the same average as a run that
    never stopped, with mixing, clipping and --no-wd on (whose draws and state the resume
    must also carry)."""
    flags = dict(RUN, epochs=3, ema=0.9, mixup=0.2, cutmix=1.0, clip_grad_norm=0.5,
                 no_wd=True, label_smoothing=0.1)
    job.train(TrainConfig(**flags, output_dir=str(tmp_path / "whole")))
    job.train(TrainConfig(**flags, output_dir=str(tmp_path / "parts"), max_steps=30))
    job.train(TrainConfig(**flags, output_dir=str(tmp_path / "parts"), resume="auto"))
    for name in ("model.params", "model-ema.params"):
        whole, parts = saved(tmp_path / "whole" / name), saved(tmp_path / "parts" / name)
        assert sorted(whole) == sorted(parts)
        for key in whole:
            np.testing.assert_array_equal(whole[key], parts[key], err_msg=f"{name} {key}")


def test_a_checkpoint_without_an_average_starts_one_from_the_resumed_model(tmp_path, capfd):
    job.train(TrainConfig(**RUN, epochs=1, output_dir=str(tmp_path)))
    run = job.train(TrainConfig(**RUN, epochs=2, ema=0.9, output_dir=str(tmp_path),
                                resume="auto", max_steps=23))
    assert "holds no --ema average: it starts from the resumed model" in capfd.readouterr().err
    model = {n: p.data().asnumpy() for n, p in
             run.net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    for name, value in run.ema.state().items():
        np.testing.assert_array_equal(value, model[name].astype(np.float32), err_msg=name)


def small_net(seed):
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, in_units=3), mx.gluon.nn.BatchNorm(in_channels=4))
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    return net, trainer


def test_the_elastic_state_commits_restores_and_syncs_the_average():
    net, trainer = small_net(0)
    ema = WeightAverage(net, 0.5)
    state = GluonState(net, trainer, bcast_object=lambda obj, name: obj, get_rank=lambda: 0,
                       ema=ema)
    state.commit()
    committed = ema.state()
    for param in net.collect_params().values():
        param.data()[:] += 1
    ema.update(1)
    assert not np.array_equal(ema.state()["0.weight"], committed["0.weight"])
    state.restore()  # a rollback undoes the steps' averaging too
    for name, value in ema.state().items():
        np.testing.assert_array_equal(value, committed[name], err_msg=name)
    # A worker that joins takes rank 0's average, not one of its own weights.
    sent = {}
    leader_state = GluonState(net, trainer, bcast_object=lambda o, n: sent.setdefault(n, o),
                              get_rank=lambda: 0, ema=ema)
    joiner, joiner_trainer = small_net(5)
    joiner_ema = WeightAverage(joiner, 0.5)
    joiner_state = GluonState(joiner, joiner_trainer,
                              bcast_object=lambda o, n: sent.setdefault(n, o),
                              get_rank=lambda: 1, ema=joiner_ema)
    leader_state.sync()
    joiner_state.sync()
    for name, value in joiner_ema.state().items():
        np.testing.assert_array_equal(value, committed[name], err_msg=name)


def test_a_run_shorter_than_the_update_interval_warns_that_the_average_never_moves(capfd):
    """Found by a new user's trial: 2 epochs of 23 steps at the default --ema-every 32 would
    evaluate the starting model as the average, silently."""
    run = job.train(TrainConfig(**RUN, epochs=1, ema=0.9))
    err = capfd.readouterr().err
    assert ("--ema: this run ends at optimizer step 23 and the average updates every 32 "
            "(--ema-every): it never moves from the starting model; give --ema-every 23 or "
            "less") in err, err
    assert run.ema is not None
    job.train(TrainConfig(**RUN, epochs=2, ema=0.9))  # 46 steps: one update, no warning
    assert "never moves" not in capfd.readouterr().err
