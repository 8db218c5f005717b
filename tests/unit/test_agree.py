"""The primitive every decision of several ranks goes through (store/agree.py), and the
registry of cross-rank sites (store/sites.py).

Ranks are threads here, each with a DistContext-like object whose sum meets the others'
at a barrier: the real agree() runs on each, as it would on each process."""
import os
import re
import threading

import mxnet as mx
import numpy as np
import pytest

from hvdtrain.config import ConfigError
from hvdtrain.store import agree as agree_mod
from hvdtrain.store.agree import AgreedConfigError, AgreedError, FaultInjected
from hvdtrain.store.sites import FAULT_ENV, SITES, site_of

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "hvdtrain")


class World:
    """`ranks` threads that sum arrays at a barrier, recording each collective's name."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.barrier = threading.Barrier(ranks)
        self.parts, self.names = {}, []

    def run(self, work):
        """work(dist) on every rank; each rank's return value or exception."""
        out = [None] * self.ranks

        def one(rank):
            try:
                out[rank] = ("ok", work(Rank(self, rank)))
            except Exception as err:  # pylint: disable=broad-except
                out[rank] = ("raised", err)
        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return out


class Rank:
    synchronous = True
    store = None

    def __init__(self, world, rank):
        self.world, self.rank, self.num_workers = world, rank, world.ranks

    def sum_across_workers(self, name, values):
        self.world.parts[self.rank] = (name, values.asnumpy())
        self.world.barrier.wait(10)
        names = {n for n, _ in self.world.parts.values()}
        assert len(names) == 1, names  # a name that differs between ranks: a hang
        if self.rank == 0:
            self.world.names.append(name)
        total = sum(v for _, v in self.world.parts.values())
        self.world.barrier.wait(10)
        return mx.nd.array(total, dtype="float64")

    def agree(self, site, reason=None, payload=None, key=""):
        return agree_mod.agree(self, site, reason, payload, key)


def test_payloads_sum_in_one_collective_named_by_the_site():
    world = World(3)
    out = world.run(lambda d: agree_mod.agree(d, "stop_vote", payload=[d.rank, 1]))
    assert all(kind == "ok" and list(v) == [3, 3] for kind, v in out), out
    assert world.names == ["agree.stop_vote"]


def test_one_ranks_reason_is_every_ranks_one_line():
    world = World(3)
    out = world.run(lambda d: agree_mod.agree(
        d, "stop_vote", RuntimeError("disk full") if d.rank == 1 else None, [1]))
    lines = {str(err) for kind, err in out}
    assert all(kind == "raised" and isinstance(err, AgreedError) for kind, err in out)
    assert lines == {"RuntimeError: disk full (rank 1; every rank stopped at stop_vote)"}
    assert world.names == ["agree.stop_vote"]  # one collective, the failure included


def test_bad_input_on_one_rank_is_a_usage_error_on_every_rank():
    world = World(2)
    out = world.run(lambda d: agree_mod.agree(
        d, "batch_sampler_draw", ConfigError("no such file") if d.rank == 0 else None))
    assert all(isinstance(err, AgreedConfigError) and isinstance(err, ConfigError)
               and err.status == 2 for _, err in out)
    assert {str(err) for _, err in out} == {
        "no such file (rank 0; every rank stopped at batch_sampler_draw)"}


def test_several_reasons_name_every_failing_rank_and_the_first_ones_reason():
    world = World(3)
    out = world.run(lambda d: agree_mod.agree(
        d, "stop_vote", f"reason of rank {d.rank}" if d.rank else None))
    assert {str(err) for _, err in out} == {
        "reason of rank 1 (rank 1, 2; every rank stopped at stop_vote)"}
    assert world.names == ["agree.stop_vote", "agree.stop_vote.reasons"]


def test_an_exception_inside_an_agreement_travels_instead_of_raising_alone():
    world = World(2)

    def work(dist):
        with agree_mod.Agreement(dist, "shard_save", size=2) as verdict:
            if dist.rank == 1:
                raise OSError("No space left on device")
            verdict.payload = np.array([1.0, 2.0])
        return verdict.result
    out = world.run(work)
    assert {str(err) for _, err in out} == {
        "OSError: No space left on device (rank 1; every rank stopped at shard_save)"}


def test_the_fault_switch_fails_the_rank_it_names_at_the_site_it_names(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "stop_vote:1")
    world = World(2)
    out = world.run(lambda d: agree_mod.agree(d, "stop_vote", payload=[1]))
    assert {str(err) for _, err in out} == {
        f"fault injected at stop_vote on rank 1 ({FAULT_ENV}) (rank 1; every rank stopped "
        f"at stop_vote)"}
    out = World(2).run(lambda d: agree_mod.agree(d, "shard_save", payload=[1]))
    assert all(kind == "ok" for kind, _ in out)  # another site: untouched
    agree_mod.fault_point("step_counts", 1)  # a data site, not named: passes
    monkeypatch.setenv(FAULT_ENV, "step_counts:0")
    agree_mod.fault_point("step_counts", 1)  # another rank
    with pytest.raises(FaultInjected):
        agree_mod.fault_point("step_counts", 0)


def test_a_lone_rank_raises_its_own_exception():
    class Alone:
        rank, num_workers, synchronous = 0, 1, True
    with pytest.raises(UserWarning, match="stale"):
        agree_mod.agree(Alone(), "shard_stale", UserWarning("stale"))
    assert list(agree_mod.agree(Alone(), "stop_vote", payload=[2])) == [2]


def test_an_unregistered_site_is_refused():
    class Alone:
        rank, num_workers, synchronous = 0, 1, True
    with pytest.raises(RuntimeError, match="no entry in hvdtrain/store/sites.py"):
        agree_mod.agree(Alone(), "a_new_vote")


# A call that names a collective: its name's first part (up to a '.' or '{') is a site.
CALLS = re.compile(r"(?:sum_across_workers|\.agree|agreement|Agreement|agree|fault_point|"
                   r"broadcast_bytes|gather_bytes)\(\s*(?:[a-z_]+,\s*)*f?\"([a-z_.]+)")
# Names held in constants, resolved here (module, constant -> its value's site).
CONSTANTS = re.compile(r"^([A-Z_]*(?:COLLECTIVE|PULSE)_NAME) = \"([a-z_.]+)", re.M)


def sources():
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as src:
                    yield os.path.relpath(path, ROOT), src.read()




def test_every_named_collective_has_a_registry_entry():
    """A call site that names a collective (a sum, a vote, a fault point) must name a site
    of store/sites.py: a new collective without its entry (and so without its fault test)
    fails here. The registry's count is printed for the notes."""
    unknown, seen = [], set()
    for path, text in sources():
        if path == os.path.join("store", "agree.py"):
            continue  # the primitive itself: its docstring's example
        for name in CALLS.findall(text) + [v for _, v in CONSTANTS.findall(text)]:
            if name.startswith("agree.") or name.startswith("hvdtrain.elastic"):
                continue  # the primitive's own, and elastic's objects (elastic.sync)
            site = site_of(name.rstrip("._"))
            if site is None:
                unknown.append(f"{path}: {name}")
            seen.add(site)
    assert not unknown, unknown
    assert len(seen) >= 20, sorted(s for s in seen if s)
    print(f"{len(SITES)} sites registered, {len(seen)} named in code")


# A call's whole f-string name, to read its placeholders.
NAMED_BY_FSTRING = re.compile(r"(?:sum_across_workers|\.agree|agreement|Agreement|agree|"
                              r"fault_point|broadcast_bytes|gather_bytes)\(\s*(?:[a-z_]+,\s*)*"
                              r"f\"([^\"]*)\"")
RANKS_OWN = re.compile(r"size|len\(|count|shape|numel|path|nbytes", re.I)


def test_no_collective_is_named_by_a_size_a_count_or_a_path():
    """A collective's name never carries a size, a count or a path (one rank's own data
    could make it differ from its peers', a hang): hvdtrain.horovod's step collectives were
    ``horovod_step.<buffer size>`` and ``horovod_step.moved.<count>``."""
    found = [f"{path}: f\"{name}\"" for path, text in sources()
             for name in NAMED_BY_FSTRING.findall(text)
             if any(RANKS_OWN.search(part) for part in re.findall(r"{([^}]*)}", name))]
    assert not found, found


def test_every_call_of_the_store_sum_names_a_literal_or_a_known_constant():
    """A sum whose name is a variable the scan cannot read must be one of these: each
    resolved to its site by hand here."""
    known = {"name", "self.name", "COLLECTIVE_NAME", "name + \".reasons\"",
             "f\"{COLLECTIVE_NAME}.{self.name}\""}
    odd = []
    for path, text in sources():
        for match in re.finditer(r"(?<!def )sum_across_workers\(\s*([^,]+),", text):
            arg = match.group(1).strip()
            if not arg.startswith(("\"", "f\"")) or arg in known:
                if arg not in known:
                    odd.append(f"{path}: {arg}")
    assert not odd, odd


def test_the_fault_switch_can_wait_for_the_nth_call_and_reaches_the_store_sum(monkeypatch):
    """``<site>:<rank>:<n>`` fails the n-th call (outputs of the calls before it are then
    on disk, for the fault test to check); a plain store sum of a registered site fails
    too (DistContext.sum_across_workers)."""
    from hvdtrain.store.dist import DistContext

    class Store:
        type = "horovod"

        def sum_exact(self, name, values):
            pass
    monkeypatch.setattr(agree_mod, "_FAULT_CALLS", {})
    monkeypatch.setenv(FAULT_ENV, "metric_sums:1:2")
    dist = DistContext(rank=1, num_workers=2, store=Store())
    dist.sum_across_workers("metric_sums.training_metrics", mx.nd.zeros(2))
    dist.sum_across_workers("running_stats", mx.nd.zeros(2))
    with pytest.raises(FaultInjected, match="fault injected at metric_sums on rank 1"):
        dist.sum_across_workers("metric_sums.validation_metrics", mx.nd.zeros(2))
