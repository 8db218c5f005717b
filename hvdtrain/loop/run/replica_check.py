"""Trust, then verify: every rank compares a digest of every array of the model.

Data parallelism promises one model on every rank. A race between operations (MXNet's
threaded engine, MKL-DNN's own weight layouts: :mod:`.layouts`) or a user's code that
changes one rank's weights would break that promise silently: the ranks would train,
evaluate and save different models. So at each epoch's end and before each checkpoint,
:class:`ReplicaCheck` has every rank hash the bytes of every array (each parameter's copy
on each device, each parameter's optimizer state and, where they have been averaged, the
running statistics) and compare the digests in one small collective.

A difference is a named event: one line on every rank (which arrays, which ranks, the
largest difference from rank 0's values) and a ``replicas`` record in ``metrics.jsonl``.
Then, by ``replica_check``:

- ``resync`` (the default): every rank takes rank 0's values of the arrays that differ,
  and training goes on as one model again (a warning, not an error: the run stays useful,
  and the record says it happened);
- ``strict``: every rank stops at that point, exit status 1 (a test, or a run that must
  not go on after a fault);
- ``off``: no check (its cost is a copy of the model to host memory and hashing it,
  ``make bench``'s ``replica check`` row).

Digests are 48 bits of BLAKE2b, held exactly in float64: the ranks' digest vectors travel
in one sum (each rank fills its own row of a ranks x arrays table), and each then knows
every rank's digest of every array, so all of them decide alike. Sizing a difference and
the re-sync cost two more, only when something differs. Each collective is named by
the site alone (a parameter server's key adds the shape, store/dist.py): a size read from
one rank's own arrays would give each rank another name where sizes differ, and a hang.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import mxnet as mx
import numpy as np

from ...store.dist import DistContext
from ...store.gluon_internals import params_by_place, statistics_of, trainer_params, updater_states
from .together import StoppedTogether, leave_together, write_together

logger = logging.getLogger("hvdtrain")

DIGEST_BITS = 48  # below float64's 53-bit mantissa: a digest travels in a sum exactly
NAMES_SHOWN = 4  # arrays named in the line; the record lists them all
COLUMNS = 3  # a replica's columns in the digest table: digest, devices differ, elements


@dataclass
class Replica:
    """One array of the model as every rank holds it: its name, and this rank's copies
    (a parameter's copy on each device, or the parts of its optimizer state)."""

    name: str
    arrays: List[mx.nd.NDArray]


@dataclass
class Drift:
    """Arrays whose copies differ between ranks (or between one rank's devices)."""

    where: str
    arrays: List[str]
    ranks: List[int]  # ranks whose copy differs from rank 0's (0: its own devices differ)
    largest: float  # the largest absolute difference from rank 0's value
    largest_in: str
    action: str

    def line(self) -> str:
        shown = ", ".join(self.arrays[:NAMES_SHOWN]) + (
            f" and {len(self.arrays) - NAMES_SHOWN} more" if len(self.arrays) > NAMES_SHOWN
            else "")
        then = {"resync": "every rank now holds rank 0's values (replica_check='resync')",
                "strict": "every rank stops (replica_check='strict')"}[self.action]
        return (f"replicas differ at {self.where}: {len(self.arrays)} array(s) ({shown}) on "
                f"rank {', '.join(map(str, self.ranks))}, largest difference "
                f"{self.largest:.3g} in {self.largest_in}; {then}")

    def record(self) -> dict:
        return {"where": self.where, "arrays": self.arrays, "ranks": self.ranks,
                "max_difference": self.largest, "max_difference_in": self.largest_in,
                "action": self.action}


def model_replicas(net, trainer, statistics: bool = True) -> List[Replica]:
    """Every array of `net` and `trainer`'s optimizer state, in an order that is the same on
    every rank: the parameters by their place in the net (each with its device copies;
    the running statistics only if `statistics`), then each trained parameter's optimizer
    state on each device (one entry whatever the optimizer keeps, none included)."""
    out = []
    places, moved_alone = params_by_place(net), statistics_of(net)
    for name in sorted(places):
        param = places[name]
        if statistics or id(param) not in moved_alone:
            out.append(Replica(name, list(param.list_data())))
    names = {id(param): name for name, param in places.items()}
    for device, states in enumerate(updater_states(trainer)):
        for index, param in enumerate(trainer_params(trainer)):
            parts = _flat(states.get(index))
            label = f"optimizer state of {names.get(id(param), param.name)}"
            out.append(Replica(label + (f" (device {device})" if device else ""), parts))
    return out


def _flat(state) -> List[mx.nd.NDArray]:
    if state is None:
        return []
    if isinstance(state, mx.nd.NDArray):
        return [state]
    return [array for part in state for array in _flat(part)]


def _digest(arrays: Sequence[mx.nd.NDArray]) -> float:
    """48 bits of BLAKE2b over the bytes of `arrays` (and their shapes and types)."""
    digest = hashlib.blake2b(digest_size=8)
    for array in arrays:
        host = array.asnumpy()
        digest.update(f"{host.shape}{host.dtype}".encode())
        digest.update(np.ascontiguousarray(host).tobytes())
    return float(int.from_bytes(digest.digest(), "little") >> (64 - DIGEST_BITS))


def local_digests(replicas: Sequence[Replica]) -> np.ndarray:
    """This rank's row of the digest table: for each replica the digest of its device 0
    copy (of all its parts, for an optimizer state), 1.0 where this rank's device copies
    differ among themselves (else 0.0), and its number of elements (what a copy of rank
    0's values then takes: every rank must know it alike)."""
    row = np.zeros(COLUMNS * len(replicas), np.float64)
    for k, replica in enumerate(replicas):
        state = replica.name.startswith("optimizer state")
        at = COLUMNS * k
        row[at] = _digest(replica.arrays if state else replica.arrays[:1])
        if not state and len(replica.arrays) > 1:
            row[at + 1] = float(any(_digest([c]) != row[at] for c in replica.arrays[1:]))
        row[at + 2] = _size(replica)
    return row


def _size(replica: Replica) -> int:
    arrays = replica.arrays if replica.name.startswith("optimizer state") else \
        replica.arrays[:1]
    return int(sum(a.size for a in arrays))


class ReplicaCheck:
    """The replica check of a run (see the module).

    Parameters
    ----------
    net, trainer
        The model and its trainer (the optimizer state).
    dist : DistContext
        The ranks that hold replicas.
    policy : str
        What follows a difference: ``replica_check``'s value (RunConfig).
    record : callable, optional
        ``record(fields)``: writes a ``replicas`` record (rank 0; a no-op elsewhere).
    """

    def __init__(self, net, trainer, dist: DistContext, policy: str = "resync",
                 record: Optional[Callable[[dict], None]] = None):
        self.net, self.trainer, self.dist, self.policy = net, trainer, dist, policy
        self._record = record
        self.checks = 0  # how often the replicas were compared
        self.drifts: List[Drift] = []

    @property
    def active(self) -> bool:
        """Whether there are replicas to compare: several synchronous ranks, or one rank's
        several devices."""
        if self.policy == "off":
            return False
        if self.dist.num_workers > 1:
            return self.dist.synchronous
        return len(next(iter(self.net.collect_params().values())).list_ctx()) > 1

    def verify(self, where: str, statistics: bool = True, state=None) -> Optional[Drift]:
        """Every rank at the same point (`where`, for the line): compare the replicas; on a
        difference say so, record it and re-sync or stop every rank (``strict``: raises
        :class:`~hvdtrain.loop.run.together.StoppedTogether`). `statistics`: include the
        running statistics (False inside an epoch, where each rank's are its own). `state`
        (the run's TrainState, when there is one) gives the record its ``epoch`` (from 0, as
        the other records count) and ``step``."""
        if not self.active:
            return None
        mx.nd.waitall()
        replicas = model_replicas(self.net, self.trainer, statistics)
        differ, ranks, sizes = self._differing(replicas)
        self.checks += 1
        if not differ:
            return None
        self._refuse_other_sizes(replicas, differ, sizes, where)
        drift = self._size_and_settle(replicas, differ, ranks, where, sizes[0])
        self.drifts.append(drift)
        # Every rank found the same: rank 0 says it (under strict, the stop's one line does).
        if drift.action == "resync" and self.dist.is_root:
            logger.warning("%s", drift.line())
        at = {} if state is None else {"epoch": state.epoch, "step": state.step}
        write_together(self.dist, lambda: self._record and self._record(dict(
            at, **drift.record())), where)
        if drift.action == "strict":
            raise StoppedTogether(f"hvdtrain: error: {drift.line()}",
                                  lambda: leave_together(self.dist))
        return drift

    def _differing(self, replicas: List[Replica]):
        """Positions of the replicas whose digest is not rank 0's on every rank (or whose
        device copies differ on some rank), the ranks that hold such a copy, and every
        rank's element count of each replica (ranks x replicas). A model of another size on
        some rank makes another table there: Horovod refuses the shapes on every rank."""
        ranks, rank = self.dist.num_workers, self.dist.rank
        table = np.zeros((ranks, COLUMNS * len(replicas)), np.float64)
        table[rank] = local_digests(replicas)
        if ranks > 1:
            table = self.dist.agree("replica_digests", payload=table).reshape(table.shape)
        digests, split, sizes = (table[:, c::COLUMNS] for c in range(COLUMNS))
        odd = (digests != digests[0]) | (split > 0)  # ranks x replicas
        return ([k for k in range(len(replicas)) if odd[:, k].any()],
                [r for r in range(ranks) if odd[r].any()], sizes.astype(np.int64))

    def _refuse_other_sizes(self, replicas, differ, sizes, where: str) -> None:
        """Arrays of another size than rank 0's on some rank cannot take its values: every
        rank stops alike (they all read the same table)."""
        other = [k for k in differ if (sizes[:, k] != sizes[0, k]).any()]
        if other:
            ranks = sorted({r for k in other for r in np.flatnonzero(sizes[:, k] != sizes[0, k])})
            raise StoppedTogether(
                f"hvdtrain: error: replicas differ in size at {where}: {len(other)} array(s) "
                f"({', '.join(replicas[k].name for k in other[:NAMES_SHOWN])}) on rank "
                f"{', '.join(map(str, ranks))}: the ranks hold different models",
                lambda: leave_together(self.dist))

    def _size_and_settle(self, replicas: List[Replica], differ: List[int],
                         differing_ranks: List[int], where: str, root_sizes) -> Drift:
        """Rank 0's values of the differing replicas on every rank (one sum), the largest
        difference from them on each rank (one more), and under ``resync`` rank 0's values
        written into every copy."""
        rank, ranks = self.dist.rank, self.dist.num_workers
        mine = [np.concatenate([a.asnumpy().astype(np.float64).ravel()
                                for a in replicas[k].arrays]) if replicas[k].arrays
                else np.zeros(0) for k in differ]
        # Sized by rank 0's counts, which every rank read in the table: never by its own.
        flat = np.concatenate(mine) if rank == 0 else \
            np.zeros(int(sum(root_sizes[k] for k in differ)))
        if ranks > 1:
            flat = self.dist.sum_across_workers(
                "replica_values", mx.nd.array(flat, dtype="float64")).asnumpy()
        gaps = np.zeros((ranks, len(differ)))
        at = 0
        for j, (k, values) in enumerate(zip(differ, mine)):
            root = flat[at:at + values.size]
            at += values.size
            gap = float(np.nanmax(np.abs(values - root))) if values.size else 0.0
            for copy in replicas[k].arrays[1:] if not replicas[k].name.startswith(
                    "optimizer state") else []:
                gap = max(gap, float(np.nanmax(np.abs(
                    copy.asnumpy().astype(np.float64).ravel() - root))))
            gaps[rank, j] = gap
            if self.policy == "resync":
                _write(replicas[k], root)
        if ranks > 1:
            gaps = self.dist.sum_across_workers(
                "replica_gaps", mx.nd.array(gaps, dtype="float64")).asnumpy()
        if self.policy == "resync":
            mx.nd.waitall()
        worst = np.unravel_index(int(np.argmax(gaps)), gaps.shape)
        return Drift(where, [replicas[k].name for k in differ], differing_ranks,
                     float(gaps[worst]), replicas[differ[worst[1]]].name, self.policy)


def _write(replica: Replica, values: np.ndarray) -> None:
    """`values` (rank 0's, float64, flat) into the replica's arrays, each in its own dtype:
    every device copy of a parameter, or the parts of an optimizer state in turn."""
    if replica.name.startswith("optimizer state"):
        at = 0
        for array in replica.arrays:
            array[:] = mx.nd.array(values[at:at + array.size].reshape(array.shape),
                                   dtype=array.dtype)
            at += array.size
        return
    for array in replica.arrays:
        array[:] = mx.nd.array(values.reshape(array.shape), dtype=array.dtype)
