"""Ranks agree after rank 0's writes, and leave together when one failed."""
import mxnet as mx
import pytest

from hvdtrain.loop.run.together import StoppedTogether, write_together
from hvdtrain.state.writes import OutputError
from hvdtrain.store.dist import DistContext


class PeerStore:
    """A store whose other rank reports `peer_flags` in every reduction, and which records
    the reductions and the shutdown it was asked for."""

    type = "horovod"

    def __init__(self, peer_flags):
        self.peer_flags = peer_flags
        self.calls = []

    def sum_exact(self, name, values):
        self.calls.append(name)
        if name == "agree.outputs_written":  # the primitive's: verdicts, then the flags
            peer = values.asnumpy() * 0
            peer[-len(self.peer_flags):] = self.peer_flags
            values += mx.nd.array(peer, dtype=values.dtype)

    def shutdown(self):
        self.calls.append("shutdown")


def _fail():
    raise OutputError("cannot write /x/metrics.jsonl: no space left on device")


def test_the_other_ranks_learn_that_rank_0_failed_and_say_so_in_one_line():
    store = PeerStore([1, 0])  # rank 0 failed
    dist = DistContext(rank=1, num_workers=2, store=store)
    with pytest.raises(StoppedTogether) as stop:
        write_together(dist, lambda: None, "step 24")
    assert stop.value.line == ("hvdtrain: error: rank 0 could not write its outputs (its own "
                               "line says why); every rank stopped at step 24")
    assert store.calls == ["agree.outputs_written"]
    stop.value.leave()  # after the line: one last collective, then an orderly shutdown
    assert store.calls == ["agree.outputs_written", "leave", "shutdown"]


def test_the_rank_that_failed_says_why_and_everyone_continues_when_no_one_failed():
    dist = DistContext(rank=0, num_workers=2, store=PeerStore([0, 0]))
    with pytest.raises(StoppedTogether) as stop:
        write_together(dist, _fail, "step 24")
    assert stop.value.line == "hvdtrain: error: cannot write /x/metrics.jsonl: no space left on device"
    write_together(DistContext(rank=1, num_workers=2, store=PeerStore([0, 0])), lambda: None,
                   "step 24")  # no one failed: nothing raised


def test_a_lone_worker_raises_its_own_error():
    with pytest.raises(OutputError, match="no space left"):
        write_together(DistContext(), _fail, "step 1")


def test_leave_never_raises_when_a_peer_is_gone():
    def gone():
        raise RuntimeError("Horovod has been shut down")
    StoppedTogether("hvdtrain: error: x", gone).leave()
