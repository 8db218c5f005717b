"""The store contract in one process (Horovod with one rank)."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import hvdtrain  # noqa: F401  registers 'horovod'
from hvdtrain.store.kvstore import HorovodKVStore, create_store


@pytest.fixture(scope="module")
def store():
    return mx.kv.create("horovod")


def test_import_registers_but_does_not_initialise_horovod():
    """Then, in the same fresh process (Horovod initialises once per process), a
    communicator that is not one fails, naming `comm`: the check that was the second half
    of test_horovod_runs_on_the_communicator_it_is_given."""
    code = ("import sys, hvdtrain, mxnet as mx; "
            "print('horovod' in mx.kvstore.KVStoreBase.kv_registry, "
            "'horovod.mxnet' in sys.modules, flush=True); "
            "hvdtrain.create_store('horovod', comm='world')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == ["True", "False"], proc.stderr[-2000:]
    assert proc.returncode != 0 and "comm" in proc.stderr, proc.stderr[-2000:]


def test_properties(store):
    assert isinstance(store, HorovodKVStore) and store.type == "horovod"
    assert (store.rank, store.num_workers, store.local_rank, store.local_size) == (0, 1, 0, 1)
    assert store.is_capable("optimizer") is False


def test_pushpull_sums_device_copies_in_place(store):
    copies = [mx.nd.array([1, 2], ctx=mx.cpu(0)), mx.nd.array([10, 20], ctx=mx.cpu(1))]
    store.pushpull("k", copies)
    assert [c.asnumpy().tolist() for c in copies] == [[11, 22], [11, 22]]
    assert copies[1].context == mx.cpu(1)


def test_pushpull_into_out_leaves_value(store):
    value, out = mx.nd.array([3.0]), mx.nd.zeros(1)
    store.pushpull(7, value, out=out)
    assert out.asscalar() == 3.0 and value.asscalar() == 3.0


def test_pushpull_list_of_keys(store):
    values = [mx.nd.ones(3), [mx.nd.ones(2), mx.nd.ones(2) * 4]]
    outs = [mx.nd.zeros(3), [mx.nd.zeros(2), mx.nd.zeros(2)]]
    store.pushpull(["a", "b"], values, out=outs)
    assert outs[0].asnumpy().tolist() == [1, 1, 1]
    assert [o.asnumpy().tolist() for o in outs[1]] == [[5, 5], [5, 5]]
    with pytest.raises(ValueError):
        store.pushpull(["a", "b"], [mx.nd.ones(1)])


def test_broadcast_writes_every_out(store):
    value = mx.nd.array([1.5, 2.5])
    outs = [value, mx.nd.zeros(2, ctx=mx.cpu(1))]
    store.broadcast("w", value, outs)
    assert outs[1].asnumpy().tolist() == [1.5, 2.5]


def test_fp16_compression_alone_is_exact():
    fp16 = HorovodKVStore(compression="fp16")
    value = mx.nd.array([1.0001, 2.0])
    fp16.pushpull("c", value)  # one worker: nothing goes on the wire, nothing is rounded
    assert value.dtype == np.float32
    assert value.asnumpy()[0] == np.float32(1.0001)
    with pytest.raises(ValueError):
        HorovodKVStore(compression="int8")


def test_trainer_drives_the_store_without_updating_on_it(store):
    net = gluon.nn.Dense(1, in_units=2)
    net.initialize(mx.init.Constant(0.0))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=store)
    x, y = mx.nd.array([[1.0, 2.0]]), mx.nd.array([[1.0]])
    losses = []
    for _ in range(20):
        with autograd.record():
            loss = ((net(x) - y) ** 2).sum()
        loss.backward()
        trainer.step(1)
        losses.append(loss.asscalar())
    assert trainer._update_on_kvstore is False  # pylint: disable=protected-access
    assert losses[-1] < 1e-3 < losses[0]


def test_create_store_variants():
    assert create_store(None) is None and create_store("none") is None
    assert create_store("local").type == "local"
    assert isinstance(create_store("horovod"), HorovodKVStore)
    with pytest.raises(ValueError, match="unknown kvstore"):
        create_store("zmq")
    with pytest.raises(ValueError, match="local store takes no options, got comm"):
        create_store("local", comm=object())


def test_a_communicator_needs_the_horovod_store():
    from hvdtrain.config import ConfigError, TrainConfig
    from hvdtrain.job import build_dist

    with pytest.raises(ConfigError, match="communicator needs --kvstore horovod"):
        build_dist(TrainConfig(dataset="digits", kvstore="local"), comm=object())


def test_horovod_runs_on_the_communicator_it_is_given():
    # In fresh processes: Horovod initialises once per process. mpi4py and Horovod must load
    # the same MPI for this to work (scripts/install-deps.sh builds mpi4py with mpicc).
    code = ("from mpi4py import MPI; from hvdtrain import create_store; "
            "s = create_store('horovod', comm=MPI.COMM_SELF); print(s.rank, s.num_workers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "1"]
    # A communicator that is not one: test_import_registers_but_does_not_initialise_horovod.


def test_fp16_wire_copies_reuse_one_buffer_per_key():
    fp16 = HorovodKVStore(compression="fp16")
    first = fp16._wire_copy("w", mx.nd.array([1.0001, 3.0]))  # pylint: disable=protected-access
    second = fp16._wire_copy("w", mx.nd.array([2.0, 5.0]))  # pylint: disable=protected-access
    assert first is second and second.dtype == np.float16
    assert second.asnumpy().tolist() == [2.0, 5.0]
    ints = mx.nd.array([1, 2], dtype=np.int32)
    assert fp16._wire_copy("i", ints) is ints  # pylint: disable=protected-access
