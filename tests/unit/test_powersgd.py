"""PowerSGD in one process: which gradients it compresses, its orthogonalisation, its
flags, and its state (carried across a re-plan, saved and loaded, guarded, reset). The
algorithm itself is checked against the paper at 2 and 3 ranks in
tests/dist/test_powersgd_reference.py."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from helpers import main_in_process
from hvdtrain.cli import parse_config
from hvdtrain.config import ConfigError
from hvdtrain.store.buckets import BucketedTrainer, plan_buckets
from hvdtrain.store.kvstore import HorovodKVStore
from hvdtrain.store.powersgd import PowerSGD
from hvdtrain.store.powersgd_factors import compresses, factor_rank, orthogonalise

BASE = ["--dataset", "digits", "--no-cuda", "--epochs", "1"]


@pytest.mark.parametrize("flags,needle", [
    (["--powersgd-rank", "2"], "--powersgd-rank sets up --compression powersgd: add it"),
    (["--powersgd-start-step", "0"], "--powersgd-start-step sets up --compression powersgd"),
    (["--powersgd-no-error-feedback"], "--powersgd-no-error-feedback sets up --compression"),
    (["--compression", "powersgd", "--kvstore", "dist_sync"],
     "it needs --kvstore horovod, not dist_sync"),
    (["--compression", "powersgd", "--kvstore", "none"], "it needs --kvstore horovod, not none"),
    (["--compression", "powersgd", "--grad-bucket-mb", "0"], "--grad-bucket-mb must be above 0"),
    (["--compression", "powersgd", "--powersgd-rank", "0"], "--powersgd-rank must be positive"),
    (["--compression", "powersgd", "--powersgd-start-step", "-1"],
     "--powersgd-start-step must be >= 0"),
    (["--compression", "zip"], "argument --compression: invalid choice"),
])
def test_bad_compression_flags_are_one_line_and_exit_2(flags, needle, capfd):
    code, lines = main_in_process(BASE + flags, capfd)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain: error: ") and needle in lines[0], lines


@pytest.mark.parametrize("flags,needle", [
    (["--dtype", "float16"], "drop --dtype float16"),
    (["--gpus", "0,1"], "one worker per GPU"),
    (["--gpus-per-worker", "2"], "one worker per GPU"),
])
def test_what_powersgd_cannot_compress_is_refused(flags, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(["--dataset", "digits", "--compression", "powersgd"] + flags)


def test_defaults_follow_ddp_and_the_paper():
    cfg = parse_config(BASE + ["--compression", "powersgd"])
    assert cfg.powersgd == (4, 1000) and not cfg.powersgd_no_error_feedback
    cfg = parse_config(BASE + ["--compression", "powersgd", "--powersgd-rank", "2",
                               "--powersgd-start-step", "0"])
    assert cfg.powersgd == (2, 0)


def test_which_gradients_are_compressed():
    # DDP's rule: (n + m) r * 2 < n m, on the gradient read as (first axis, the rest).
    assert compresses((512, 512, 3, 3), 4) and compresses((10, 512), 4)
    assert not compresses((10, 512), 8)  # (522 * 8 * 2 = 8352) > 5120
    assert not compresses((64,), 1) and not compresses((3, 2), 1)
    assert factor_rank((10, 512), 16) == 10 and factor_rank((64, 3, 7, 7), 4) == 4


def test_orthogonalise_gives_gram_schmidts_columns():
    p = np.random.RandomState(0).standard_normal((30, 4))
    q, r = np.linalg.qr(p)
    expected = q * np.sign(np.diag(r))  # Gram-Schmidt's R has a positive diagonal
    out = mx.nd.zeros((30, 4))
    orthogonalise(mx.nd.array(p), out)
    np.testing.assert_allclose(out.asnumpy(), expected, atol=1e-5)
    orthogonalise(mx.nd.zeros((30, 4)), out)  # a gradient of zeros: no NaN
    assert np.isfinite(out.asnumpy()).all()


def test_compressed_and_whole_gradients_fill_buckets_of_their_own():
    f32 = np.dtype("float32")
    kinds = [(f32, True), (f32, False), (f32, True), (f32, False)]
    assert plan_buckets([4, 4, 4, 4], 100, kinds) == [[3, 1], [2, 0]]


class TwinStore(HorovodKVStore):
    """The Horovod store of one process posing as `workers` ranks that all hold the same
    gradients: every sum is `workers` times this rank's own."""

    def __init__(self, workers=2):
        super().__init__()
        self.workers = workers

    @property
    def num_workers(self):
        return self.workers

    def pushpull(self, key, value, out=None, priority=0):
        value *= self.workers

    sum_exact = pushpull


def dense_net():
    """Two Dense layers named inside the net's scope (``...dense0_``, ``...dense1_``), so that
    Gluon's sort by name keeps them in this order in every net: with global names
    (``dense9_``, ``dense10_``) two nets made at different points of a test process can sort
    their layers apart, and a saved error went to the other layer's position."""
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(32, in_units=40), gluon.nn.Dense(10, in_units=32))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    return net


def make_trainer(net, compression, store):
    return BucketedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=store,
                           update_on_kvstore=False, bucket_mb=25, compression=compression)


def weights(trainer):
    """Positions of the two weight matrices among the Trainer's parameters (Gluon sorts
    them by name)."""
    return [i for i, p in enumerate(trainer._params) if p.name.endswith("weight")]  # pylint: disable=protected-access


def train(net, trainer, steps, x=None):
    x = mx.nd.random.uniform(shape=(8, 40)) if x is None else x
    for _ in range(steps):
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(8)
    mx.nd.waitall()


@pytest.fixture(scope="module")
def store():
    return TwinStore()


def test_state_survives_a_re_plan_and_a_save_and_load(store):
    net = dense_net()
    compression = PowerSGD(rank=2, start_step=0, seed=3)
    trainer = make_trainer(net, compression, store)
    train(net, trainer, 3)
    first, second = weights(trainer)
    before = {i: compression.factors(i) for i in (first, second)}
    assert np.abs(before[first][2]).max() > 0  # an error is kept
    net.collect_params().setattr("grad_req", "add")  # gradients re-created: a re-plan
    trainer.follow_gradients()
    for i in (first, second):  # Q and the error (P is made afresh every step)
        for was, now in zip(before[i][1:], compression.factors(i)[1:]):
            np.testing.assert_allclose(now, was, rtol=1e-6, atol=1e-7)
    saved = compression.snapshot()  # errors summed over the 2 twins
    np.testing.assert_allclose(saved[f"error.{first}"], 2 * before[first][2], rtol=1e-6,
                               atol=1e-7)
    other = PowerSGD(rank=2, start_step=0, seed=99)
    make_trainer(dense_net(), other, store)._init_kvstore()  # planned, then loaded
    other.load(saved, step=7)
    assert other.steps == 7
    for i in (first, second):
        for was, now in zip(before[i][1:], other.factors(i)[1:]):  # Q, this rank's error
            np.testing.assert_allclose(now, was, rtol=1e-6, atol=1e-7)
    other.reset(step=9)  # an elastic reset
    assert other.steps == 9 and not np.abs(other.factors(first)[2]).any()


def test_a_non_finite_step_leaves_the_state_usable_under_the_guard(store):
    net = dense_net()
    compression = PowerSGD(rank=2, start_step=0, seed=3, guard=True)
    trainer = make_trainer(net, compression, store)
    train(net, trainer, 2)
    q_before = compression.factors(weights(trainer)[0])[1]
    bad = mx.nd.random.uniform(shape=(8, 40))
    bad[0, 0] = np.inf  # as a float16 overflow under AMP: every rank's sum is non-finite
    train(net, trainer, 1, bad)
    _, q, error = compression.factors(weights(trainer)[0])
    np.testing.assert_array_equal(q, q_before)  # not NaN: the next step starts from it
    assert not error.any()


def test_steps_before_the_start_and_alone_go_whole():
    net = dense_net()
    compression = PowerSGD(rank=2, start_step=2, seed=3)
    trainer = make_trainer(net, compression, TwinStore())
    train(net, trainer, 2)
    first = weights(trainer)[0]
    assert not np.abs(compression.factors(first)[2]).any()  # no error: nothing compressed
    train(net, trainer, 1)
    assert np.abs(compression.factors(first)[2]).any()


def test_an_elastic_restore_resets_the_errors_and_q(store):
    from hvdtrain.loop.elastic.state import GluonState
    from hvdtrain.state.train_state import TrainState
    net = dense_net()
    compression = PowerSGD(rank=2, start_step=0, seed=3)
    trainer = make_trainer(net, compression, store)
    train(net, trainer, 1)
    first = weights(trainer)[0]
    trained_q = compression.factors(first)[1]  # Q after one compressed step
    state = GluonState(net, trainer, TrainState(step=1), bcast_object=lambda obj, name: obj,
                       get_rank=lambda: 0)
    state.commit()
    train(net, trainer, 2)
    assert np.abs(compression.factors(first)[2]).any()
    state.restore()  # the survivors of a failure roll back to the commit
    _, q, error = compression.factors(first)
    assert compression.steps == 1 and not error.any()
    assert not np.allclose(q, trained_q)  # Q is the seed's again, not the trained one
    seeded = np.random.RandomState([3, first]).standard_normal(q.shape)
    np.testing.assert_allclose(q, seeded, rtol=1e-6)


class SkippingLoader:
    """Three batches of 8 (one optimizer step each), the second with no usable sample (every
    image of it unreadable), as a streamed loader yields them."""

    batch_size = 8

    def __init__(self):
        rng = np.random.default_rng(0)
        self.batches = [(rng.random((n, 40)).astype(np.float32), np.arange(n) % 10)
                        for n in (8, 0, 8)]
        self.sampler = list(range(24))
        self.skipped = ["a: unreadable"] * 8

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def test_a_step_no_rank_had_a_sample_for_counts_as_a_step(store):
    """No update runs at such a step, nor an exchange; PowerSGD still counts it, so that its
    count is the run's step count, which a resume continues it from (the checkpoint's step):
    otherwise --powersgd-start-step would flip at another step after a resume."""
    from hvdtrain.classify.processor import ClassifierProcessor, StepContext
    from hvdtrain.loop.engine.epoch import Loop, train_epoch
    from hvdtrain.loop.engine.precision import Precision
    from hvdtrain.loop.engine.guard import FiniteGuard
    from hvdtrain.state.train_state import TrainState
    from hvdtrain.store.dist import DistContext
    net = dense_net()
    compression = PowerSGD(rank=2, start_step=0, seed=3)
    trainer = make_trainer(net, compression, store)
    dist = DistContext()
    state = TrainState()
    loop = Loop(net, trainer, [mx.cpu()], dist, lambda _: 0.1, FiniteGuard(dist, mx.cpu()),
                steps_per_epoch=3, max_bad_samples="100", train_size=24,
                processor=ClassifierProcessor(),
                context=StepContext(net, trainer, [mx.cpu()], dist, Precision(), state))
    stats = train_epoch(loop, SkippingLoader(), state)
    assert stats.complete and state.step == 3 and stats.skipped == 8
    assert compression.steps == state.step
