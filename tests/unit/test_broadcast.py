"""Broadcasts as sums (hvdtrain/store/broadcast.py): right values, and never Horovod's
broadcast, which can crash a rank. Fake two-rank Horovod modules stand in for real ranks
here; tests/dist/test_store_contract.py runs the same code on real ones."""
import pathlib
import re

import mxnet as mx
import numpy as np
import pytest

from hvdtrain.store.broadcast import broadcast_, broadcast_object
from hvdtrain.store.kvstore import HorovodKVStore

REPO = pathlib.Path(__file__).resolve().parents[2]


class FakeHorovod:
    """One rank of a two-rank job whose wire is a dict shared with the other fake.

    Rank 0 runs first and leaves what it sends on the wire; rank 1's allreduce adds it. It
    has no broadcast of any kind: calling one fails the test."""

    Sum = "sum"

    def __init__(self, rank, wire):
        self._rank, self.wire, self.calls = rank, wire, []

    def rank(self):
        return self._rank

    def size(self):
        return 2

    def allreduce_(self, tensor, op, name, priority=0):
        assert op == self.Sum
        self.calls.append(name)
        if self._rank == 0:
            self.wire[name] = tensor.asnumpy().copy()
        else:
            tensor += mx.nd.array(self.wire[name], dtype=tensor.dtype)
        return tensor


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64", "uint8"])
def test_a_non_root_rank_ends_with_rank_zeros_values_whatever_it_held(dtype):
    wire = {}
    sent = np.arange(6).astype(dtype)
    root, other = FakeHorovod(0, wire), FakeHorovod(1, wire)
    broadcast_(root, mx.nd.array(sent, dtype=dtype), "w")
    held = np.full(6, np.nan if dtype.startswith("float") else 7).astype(dtype)
    received = broadcast_(other, mx.nd.array(held, dtype=dtype), "w")
    np.testing.assert_array_equal(received.asnumpy(), sent)
    assert received.dtype == np.dtype(dtype)


def test_an_object_arrives_whole_under_one_name_on_every_rank():
    wire = {}
    obj = {"weights": np.linspace(0, 1, 1000, dtype=np.float32), "blob": bytes(range(256)),
           "epoch": 3}
    root, other = FakeHorovod(0, wire), FakeHorovod(1, wire)
    assert broadcast_object(root, obj, "state") is obj
    copy = broadcast_object(other, None, "state")
    np.testing.assert_array_equal(copy["weights"], obj["weights"])
    assert (copy["blob"], copy["epoch"]) == (obj["blob"], 3)
    assert root.calls == other.calls == ["state.size", "state.bytes"]


def test_the_store_broadcasts_with_a_sum_and_fills_every_out():
    wire = {}
    stores = []
    for rank in (0, 1):
        store = HorovodKVStore.__new__(HorovodKVStore)  # no hvd.init: a fake Horovod
        store._hvd = FakeHorovod(rank, wire)  # pylint: disable=protected-access
        stores.append(store)
    stores[0].broadcast("w", mx.nd.array([1.5, -2.0]), out=[])
    value, copy = mx.nd.array([9.0, 9.0]), mx.nd.zeros(2, ctx=mx.cpu(1))
    stores[1].broadcast("w", value, out=[value, copy])
    assert value.asnumpy().tolist() == copy.asnumpy().tolist() == [1.5, -2.0]
    assert stores[1]._hvd.calls == ["broadcast.w"]  # pylint: disable=protected-access


def test_no_program_of_the_project_calls_horovods_own_broadcast():
    """horovod.mxnet's broadcast_, broadcast and broadcast_parameters, and broadcast_object
    built on them, can crash a rank (Horovod 0.28.1); every broadcast goes through
    hvdtrain.store.broadcast instead."""
    pattern = re.compile(r"\bhvd\.(broadcast\w*)\s*\(")
    shows_the_crash = REPO / "scripts" / "horovod_broadcast_race.py"
    found = []
    for folder in ("hvdtrain", "scripts", "examples", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == shows_the_crash:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and not line.lstrip().startswith("#"):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
