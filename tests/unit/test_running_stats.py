"""Averaging the arrays no gradient reaches over a worker's devices (mx.cpu(i) stand in)."""
import mxnet as mx
import numpy as np
from mxnet import autograd

from hvdtrain.store.dist import DistContext
from hvdtrain.models import build_model
from hvdtrain.loop.engine.replicas import average_running_stats, running_statistics

DEVICES = [mx.cpu(0), mx.cpu(1), mx.cpu(2)]


def bn_net_with_drifted_stats():
    net = build_model("bn_cnn", classes=10)
    net.initialize(ctx=DEVICES)
    rng = np.random.default_rng(0)
    for index, device in enumerate(DEVICES):  # each device trains on its own batch
        with autograd.record():
            out = net(mx.nd.array(rng.normal(index, 1 + index, (4, 1, 8, 8)), ctx=device))
        out.backward()  # MXNet 1.x moves the running statistics in BatchNorm's backward
    return net


def test_running_stats_become_the_mean_of_the_device_copies():
    net = bn_net_with_drifted_stats()
    stats = running_statistics(net)
    assert [p.name.rsplit("_", 2)[-2:] for p in stats][:2] == [["running", "mean"],
                                                               ["running", "var"]]
    before = {p.name: [c.asnumpy() for c in p.list_data()] for p in stats}
    assert not np.allclose(before[stats[0].name][0], before[stats[0].name][2])
    assert average_running_stats(net, DistContext()) == len(stats) == 4
    for param in stats:
        expected = np.mean(before[param.name], axis=0)
        for copy in param.list_data():
            np.testing.assert_allclose(copy.asnumpy(), expected, rtol=1e-6, err_msg=param.name)
        assert [c.context for c in param.list_data()] == DEVICES


def test_nothing_to_do_for_one_device_and_one_worker():
    net = build_model("bn_cnn", classes=10)
    net.initialize()
    assert average_running_stats(net, DistContext()) == 0
    assert average_running_stats(build_model("mlp", 10), DistContext()) == 0


def test_frozen_weights_are_not_statistics_and_stay_as_they_are():
    """A parameter frozen with grad_req='null' (--freeze-epochs, or a user's own) is the same
    on every replica: it is not averaged, so it neither travels nor changes."""
    net = bn_net_with_drifted_stats()
    frozen = [p for p in net.collect_params().values() if p.name.endswith("weight")]
    for param in frozen:
        param.grad_req = "null"
    # Equal copies that a float32 mean of three would round: 0.1 + 0.1 + 0.1 != 0.3.
    for param in frozen:
        for copy in param.list_data():
            copy[:] = 0.1
    names = {p.name for p in running_statistics(net)}
    assert names and not names & {p.name for p in frozen}
    assert all(n.endswith(("running_mean", "running_var")) for n in names)
    average_running_stats(net, DistContext())
    for param in frozen:
        for copy in param.list_data():
            assert (copy.asnumpy() == np.float32(0.1)).all(), param.name


def test_equal_statistics_come_back_bit_for_bit():
    """The mean is taken in float64: equal float32 copies average to themselves exactly (a
    float32 sum of three 0.1s divided by 3 is 0.10000001)."""
    net = bn_net_with_drifted_stats()
    stats = running_statistics(net)
    values = np.random.default_rng(3).random(stats[0].shape).astype(np.float32)
    for copy in stats[0].list_data():
        copy[:] = values
    average_running_stats(net, DistContext())
    for copy in stats[0].list_data():
        assert (copy.asnumpy() == values).all()


def symbol_bn_net():
    """A SymbolBlock holding a BatchNorm brought in as a symbol (as GluonCV's SSD
    FeatureExpander builds its extra layers), inside a HybridSequential with a frozen Dense:
    Gluon makes its moving mean and variance grad_req='null' but differentiable."""
    data = mx.sym.var("data")
    body = mx.sym.BatchNorm(mx.sym.Convolution(data, num_filter=3, kernel=(3, 3),
                                               name="expand_conv0"), name="expand_bn0")
    block = mx.gluon.SymbolBlock(body, [data])
    net = mx.gluon.nn.HybridSequential()
    frozen = mx.gluon.nn.Dense(4)
    net.add(block, frozen)
    net.initialize(ctx=DEVICES)
    frozen.collect_params().setattr("grad_req", "null")
    return net


def test_a_symbolblocks_batchnorm_statistics_are_averaged_as_batchnorms_are():
    """Every device moves the SymbolBlock's BatchNorm statistics on its own batch; they
    become the mean of the copies, as a BatchNorm block's do (issue 63, finding 7: they were
    never averaged, and the replica check then found them different every epoch). A frozen
    weight is not a statistic."""
    net = symbol_bn_net()
    stats = running_statistics(net)
    assert sorted(p.name for p in stats) == ["expand_bn0_moving_mean", "expand_bn0_moving_var"]
    rng = np.random.default_rng(1)
    for index, device in enumerate(DEVICES):
        with autograd.record():
            out = net(mx.nd.array(rng.normal(index, 1 + index, (4, 1, 6, 6)), ctx=device))
        out.backward()
    before = {p.name: [c.asnumpy() for c in p.list_data()] for p in stats}
    assert not np.allclose(before["expand_bn0_moving_mean"][0],
                           before["expand_bn0_moving_mean"][2])
    assert average_running_stats(net, DistContext()) == 2
    for param in stats:
        expected = np.mean(before[param.name], axis=0)
        for copy in param.list_data():
            np.testing.assert_allclose(copy.asnumpy(), expected, rtol=1e-6, err_msg=param.name)
