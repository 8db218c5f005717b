"""``Embedding(sparse_grad=True)`` on the Horovod store is refused in one line that names the
parameter and the change to make (it failed with MXNet's traceback about multi-device
training); the same model with ``sparse_grad=False`` trains, and so does the sparse one
without a store."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from hvdtrain import ConfigError
from hvdtrain.estimator import Estimator


def model(sparse):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Embedding(50, 8, sparse_grad=sparse), gluon.nn.Flatten(), gluon.nn.Dense(2))
    net.initialize()
    return net


def estimator(sparse, **options):
    net = model(sparse)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    return Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer,
                     context=mx.cpu(), log_interval=0, **options)


def data():
    rng = np.random.default_rng(0)
    return gluon.data.DataLoader(gluon.data.ArrayDataset(
        mx.nd.array(rng.integers(0, 50, (16, 4))), mx.nd.array(rng.integers(0, 2, 16))),
        batch_size=8)


def test_sparse_gradients_on_the_horovod_store_are_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        estimator(True)
    line = str(refused.value)
    assert "\n" not in line and "embedding" in line and "sparse_grad=False" in line, line


@pytest.mark.parametrize("sparse, options", [(False, {}), (True, {"kvstore": "none"})])
def test_a_dense_embedding_or_a_sparse_one_without_a_store_trains(sparse, options):
    est = estimator(sparse, **options)
    before = est.net[0].weight.data().asnumpy().copy()
    est.fit(data(), epochs=1)
    assert not np.allclose(est.net[0].weight.data().asnumpy(), before)
