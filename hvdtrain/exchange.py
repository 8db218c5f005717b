"""Gradient exchange in buckets: a few grouped allreduces per step, not one per parameter.

Gluon's Trainer hands the store one ``pushpull`` per parameter. Horovod then fuses whatever
happens to be ready within one cycle, so which gradients travel together, and how many
collectives a step costs, depends on timing. :class:`BucketedTrainer` instead plans fixed
buckets once, in the order backward produces gradients (last layer first), and reduces each
bucket with one grouped call as soon as its last gradient is computed: the first buckets
travel while backward is still running through the early layers, the same plan runs on
every rank, and fusion is the same every step.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
from mxnet import gluon

MIB = 2 ** 20


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> List[List[int]]:
    """Group parameter positions into buckets of at most `bucket_bytes`.

    Parameters
    ----------
    sizes : sequence of int
        Bytes of each parameter's gradient, in the Trainer's parameter order.
    bucket_bytes : int
        Cap of a bucket; a gradient larger than the cap gets a bucket of its own.
        0 puts every parameter in a bucket of its own.

    Returns
    -------
    list of list of int
        Positions into `sizes`, starting from the last parameter (the first gradient
        backward produces); each bucket lists its positions in decreasing order.
    """
    buckets: List[List[int]] = []
    current: List[int] = []
    filled = 0
    for position in reversed(range(len(sizes))):
        size = sizes[position]
        if current and filled + size > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(position)
        filled += size
    if current:
        buckets.append(current)
    return buckets


class BucketedTrainer(gluon.Trainer):
    """A Gluon Trainer whose gradient exchange is a few grouped ``pushpull`` calls.

    Parameters
    ----------
    *args, **kwargs
        As :class:`mxnet.gluon.Trainer`.
    bucket_mb : float
        Cap of a bucket in MiB; 0 keeps the Trainer's own exchange, one call per
        parameter.

    Buckets apply to a store that reduces lists of keys in one call (``horovod``) and only
    reduces gradients (``update_on_kvstore=False``) that are all dense; anything else takes
    the Trainer's own path.
    """

    GROUPING_STORES = ("horovod",)

    def __init__(self, *args, bucket_mb: float = 0.0, **kwargs):
        self._bucket_bytes = int(bucket_mb * MIB)
        self.buckets: List[List[int]] = []  # parameter positions; planned with the store
        super().__init__(*args, **kwargs)

    def _init_kvstore(self):
        # The store, and whether it reduces gradients only, are known from here on.
        super()._init_kvstore()
        self.buckets = self._plan() if self._bucketing() else []

    def _bucketing(self) -> bool:
        store = self._kvstore
        return (self._bucket_bytes > 0 and store is not None and not self._update_on_kvstore
                and store.type in self.GROUPING_STORES
                and all(p.grad_req == "null" or p.list_grad()[0].stype == "default"
                        for p in self._params))

    def _plan(self) -> List[List[int]]:
        reduced = [i for i, p in enumerate(self._params) if p.grad_req != "null"]
        grads = [self._params[i].list_grad()[0] for i in reduced]
        sizes = [g.size * np.dtype(g.dtype).itemsize for g in grads]
        return [[reduced[j] for j in bucket] for bucket in plan_buckets(sizes, self._bucket_bytes)]

    def _allreduce_grads(self):
        if not self.buckets:
            super()._allreduce_grads()
            return
        for bucket in self.buckets:
            # Same rule as the Trainer's per-key priority: earlier layers, needed first by
            # the next forward pass, rank higher in MXNet's engine.
            self._kvstore.pushpull(bucket, [self._params[i].list_grad() for i in bucket],
                                   priority=-min(bucket))
