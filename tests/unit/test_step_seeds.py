"""Each step's random numbers: seeded only where a step draws them (issue 64), read from the
model (Dropout, random operators in a hybridized graph or a SymbolBlock, a block whose own
code may draw); a resume with Dropout still ends as the uninterrupted run, bit for bit; and a
run that can resume says that a loader's own draws are not replayed (issue 63, finding 10).
(Two ranks and a SIGTERM: tests/dist/test_estimator_models.py.)"""
import json
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from hvdtrain.estimator import BatchProcessor, Estimator
from hvdtrain.loop.engine.draws import block_draws, op_draws

FEATURES, TRAIN, BATCH = 5, 40, 8  # 5 steps an epoch


def data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(TRAIN, FEATURES)).astype(np.float32)
    return gluon.data.ArrayDataset(x, np.sin(x[:, :1]).astype(np.float32))


def make_net(dropout=0.0, hybridize=False, seed=7):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"))
    if dropout:
        net.add(gluon.nn.Dropout(dropout))
    net.add(gluon.nn.Dense(1))
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    net(mx.nd.zeros((1, FEATURES)))
    return net


class Noisy(gluon.HybridBlock):
    """Adds noise drawn in its own hybrid_forward (no Gluon layer says so)."""

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return F.broadcast_add(x, F.random.normal(shape=(1,)))


class Plain(gluon.HybridBlock):
    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return F.relu(x)


class OwnForward(gluon.Block):
    def forward(self, x):  # pylint: disable=arguments-differ
        return x


def exported(net, tmp_path):
    tmp_path.mkdir()
    net(mx.nd.zeros((1, FEATURES)))
    net.export(str(tmp_path / "net"))
    return gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), ["data"],
                                     str(tmp_path / "net-0000.params"))


def test_what_draws_is_read_from_the_model(tmp_path):
    for hybridize in (False, True):
        assert block_draws(make_net(0.0, hybridize)) is False
        assert block_draws(make_net(0.1, hybridize)) is True
    assert block_draws(exported(make_net(0.2, True), tmp_path / "a")) is True
    assert block_draws(exported(make_net(0.0, True), tmp_path / "b")) is False
    # A block of the user's own: unknown (so drawing) until its graph shows what it does.
    noisy, plain = Noisy(), Plain()
    assert block_draws(noisy) is True and block_draws(plain) is True
    assert block_draws(OwnForward()) is True
    noisy.hybridize()
    plain.hybridize()
    assert block_draws(noisy) is None and block_draws(plain) is None  # no graph yet
    noisy(mx.nd.ones((2,)))
    plain(mx.nd.ones((2,)))
    assert block_draws(noisy) is True and block_draws(plain) is False
    assert block_draws(gluon.rnn.LSTM(4, num_layers=2, dropout=0.2)) is True
    assert block_draws(gluon.rnn.LSTM(4)) is False
    assert block_draws(gluon.nn.HybridLambda(lambda F, x: x)) is True
    said = make_net(0.0)
    said.draws_random = True  # a model that says so
    assert block_draws(said) is True
    assert op_draws("_sample_uniform", {}) and op_draws("_npi_bernoulli", {})
    assert op_draws("Dropout", {}) and not op_draws("Dropout", {"p": "0.0"})
    assert not op_draws("random_pdf_normal", {}) and not op_draws("BilinearSampler", {})


def estimator(net, **options):
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    return Estimator(net, gluon.loss.L2Loss(), train_metrics=[mx.metric.RMSE()],
                     trainer=trainer, context=mx.cpu(), kvstore="none", log_interval=0,
                     **options)


class Drawing(BatchProcessor):
    """A processor of the user's own: its fit_batch may draw (it says nothing)."""

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        return super().fit_batch(estimator, train_batch, batch_axis)


@pytest.mark.parametrize("dropout, hybridize, processor, seeded", [
    (0.0, False, None, 2), (0.0, True, None, 2),  # each epoch's first step only
    (0.1, False, None, 10), (0.1, True, None, 10),  # every step
    (0.0, True, Drawing, 10),
])
def test_only_steps_that_draw_are_seeded(dropout, hybridize, processor, seeded, monkeypatch):
    """mx.random.seed costs as much as a small model's step: a model that draws nothing is
    seeded once an epoch (before its graph is read), one that draws before every step."""
    net = make_net(dropout, hybridize)
    est = estimator(net, batch_processor=processor() if processor else None)
    calls = []
    seed = mx.random.seed
    monkeypatch.setattr(mx.random, "seed", lambda *a, **k: (calls.append(a), seed(*a, **k)))
    est.fit(gluon.data.DataLoader(data(), batch_size=BATCH), epochs=2)
    assert len(calls) == seeded


@pytest.mark.parametrize("hybridize", [False, True])
def test_a_resume_with_dropout_ends_as_the_uninterrupted_run(hybridize, tmp_path):
    loader = lambda: gluon.data.DataLoader(data(), batch_size=BATCH, shuffle=True)  # noqa: E731
    whole = make_net(0.3, hybridize)
    estimator(whole).fit(loader(), epochs=3)
    stopped = make_net(0.3, hybridize)
    estimator(stopped, output_dir=str(tmp_path), max_steps=7).fit(loader(), epochs=3)
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-2]["event"] == "stop" and records[-2]["step"] == 7  # in epoch 2 of 3
    resumed = make_net(0.3, hybridize, seed=99)  # and its generator elsewhere
    estimator(resumed, output_dir=str(tmp_path), resume="auto").fit(loader(), epochs=3)
    for (name, want), got in zip(whole.collect_params().items(),
                                 resumed.collect_params().values()):
        np.testing.assert_array_equal(got.data().asnumpy(), want.data().asnumpy(),
                                      err_msg=name)


def test_a_run_that_can_resume_says_a_loaders_own_draws_are_not_replayed(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="hvdtrain"):
        estimator(make_net(), max_steps=1).fit(
            gluon.data.DataLoader(data(), batch_size=BATCH), epochs=1)
        assert "a loader's own" not in caplog.text  # nothing to resume
        estimator(make_net(), max_steps=1, output_dir=str(tmp_path)).fit(
            gluon.data.DataLoader(data(), batch_size=BATCH), epochs=1)
    lines = [r.getMessage() for r in caplog.records if "a loader's own" in r.getMessage()]
    assert len(lines) == 1 and "not replayed" in lines[0] and "transforms" in lines[0]
