"""The Estimator's watch on inference passes (loop/engine/layouts.py): it sees a pass in
predict mode, and a script that hybridizes its net again is not shown the whole model."""
import warnings

import mxnet as mx
import pytest

from hvdtrain.loop.engine.layouts import InferenceLayouts, mkldnn_enabled

pytestmark = pytest.mark.skipif(not mkldnn_enabled(), reason="hooks only under MKL-DNN")


def _net():
    with mx.name.NameManager():  # the process's name counters left as they were
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(3), mx.gluon.nn.Dense(2))
    net.initialize()
    return net


def _hybridize_twice(net):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # what a script may have set: before the watch
        watch = InferenceLayouts([net], net.collect_params().values())
        net.hybridize()
        net(mx.nd.ones((1, 4)))  # predict mode: an inference pass
        net.hybridize(static_alloc=True)  # as GluonCV's SSD script does each epoch
    return watch, [str(w.message) for w in seen]


def test_hybridizing_again_does_not_print_the_model():
    watch, messages = _hybridize_twice(_net())
    assert watch.pending  # the hook still runs on the hybridized net
    assert not [m for m in messages if "is being hybridized" in m], messages
    watch.close()


def test_the_warning_is_mxnets_without_the_watch():
    """What the test above would see: MXNet's warning, the model's repr in it."""
    net = _net()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        net.register_forward_pre_hook(lambda *_: None)
        net.hybridize()
    assert any("Dense(None -> 3" in str(w.message) for w in seen)


def test_closing_the_watch_removes_its_filter():
    before = list(warnings.filters)
    watch = InferenceLayouts([_net()], [])
    assert len(warnings.filters) == len(before) + 1
    watch.close()
    assert warnings.filters == before
