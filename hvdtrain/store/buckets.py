"""Gradient exchange in buckets: a few grouped allreduces per step, not one per parameter.

Gluon's Trainer hands the store one ``pushpull`` per parameter. Horovod then fuses whatever
happens to be ready within one cycle, so which gradients travel together, and how many
collectives a step costs, depends on timing. :class:`BucketedTrainer` instead plans fixed
buckets once, in the order backward produces gradients (last layer first), one dtype per
bucket, and reduces each bucket with one call: the same plan runs on every rank, and fusion
is the same every step.

The buckets copy nothing. Each bucket's gradients live as views into one flat buffer per
device (as PyTorch DDP's ``gradient_as_bucket_view``): backward writes each gradient
straight into its slice, and the bucket is reduced by one in-place allreduce of the flat
buffer. A grouped allreduce of separate arrays would instead copy every gradient into
Horovod's fusion buffer and back out, about 40% of the exchange on a 2-core host.

The Trainer's contract holds whatever is done to the parameters (docs/performance.md,
"Gradient buckets and Gluon's contract"): gradients Gluon re-creates are found at the next
step and the buckets re-planned, and a gradient that backward writes elsewhere than its
bucket is copied in.
"""
from __future__ import annotations

import logging
from typing import List, Optional

import mxnet as mx
import numpy as np
from mxnet import gluon

from .bucket_plan import plan_buckets
from .gluon_internals import (bound_gradient, bound_gradient_addresses, gradient_lists,
                              rehome_gradient)
from .powersgd import PowerSGD

MIB = 2 ** 20
logger = logging.getLogger("hvdtrain")


class BucketedTrainer(gluon.Trainer):
    """A Gluon Trainer whose gradient exchange is a few in-place allreduces of flat buffers.

    Parameters
    ----------
    *args, **kwargs
        As :class:`mxnet.gluon.Trainer`.
    bucket_mb : float
        Cap of a bucket in MiB; 0 keeps the Trainer's own exchange, one call per
        parameter.
    compression : PowerSGD, optional
        Compress the gradients it takes (:mod:`.powersgd`): they fill buckets of their
        own, each exchanged as low-rank factors; one device per worker.

    Buckets apply to a store that reduces gradients only (``update_on_kvstore=False``)
    with names of its own choosing (``horovod``), when every gradient is dense; anything
    else takes the Trainer's own path. When the store is set up (before the first step,
    or at it), each bucket's gradients are moved into one flat buffer per device, keeping
    their values; from then on ``param.grad()`` is a view into that buffer.

    Each step first checks, without waiting for the device, that the plan still holds:
    gradients Gluon re-created since (``grad_req`` changed, ``reset_ctx``, ``cast``) make it
    re-plan the buckets; a gradient that backward wrote elsewhere than its view (a graph
    hybridized with ``static_alloc`` that ran backward before the buckets existed keeps its
    own arrays) is copied into its bucket, and the view offered to backward again.

    Attributes
    ----------
    buckets : list of list of int
        The Trainer's parameter positions in each bucket, in reduction order.
    replans : int
        How often the buckets were planned again after the first plan.
    copied_gradients : int
        How many gradients were copied into their buckets because backward had written
        them elsewhere (0 while every gradient is written in place).
    """

    GROUPING_STORES = ("horovod",)

    def __init__(self, *args, bucket_mb: float = 0.0, compression: Optional[PowerSGD] = None,
                 **kwargs):
        self._bucket_bytes = int(bucket_mb * MIB)
        self.compression = compression
        self._factored: list = []  # per bucket: its PowerSGD factors, or None (goes whole)
        self.buckets: List[List[int]] = []  # parameter positions; planned with the store
        self.replans = -1  # the first plan makes it 0
        self.copied_gradients = 0
        self._bucketed = False  # whether this store reduces in buckets at all
        self._flat_grads: List[List[mx.nd.NDArray]] = []  # per bucket, one per device
        self._grad_lists: list = []  # Gluon's gradient list of each parameter at the plan
        self._views: list = []  # (param, device, view) of every bucketed gradient
        self._bucketed_data: list = []  # their parameters' data arrays, in the same order
        self._addresses: list = []  # where backward writes into each view
        self._warned_copies = False
        super().__init__(*args, **kwargs)

    def _init_kvstore(self):
        # The store, and whether it reduces gradients only, are known from here on.
        super()._init_kvstore()
        self._bucketed = self._bucketing()
        self._replan()

    def _bucketing(self) -> bool:
        store = self._kvstore
        return (self._bucket_bytes > 0 and store is not None and not self._update_on_kvstore
                and store.type in self.GROUPING_STORES
                and all(p.grad_req == "null" or p.list_grad()[0].stype == "default"
                        for p in self._params))

    def _replan(self) -> None:
        """Plan the buckets from the gradients as they are now and move them in."""
        self.buckets = self._plan() if self._bucketed else []
        self._flat_grads = [self._flatten(bucket) for bucket in self.buckets]
        self._factored = [None] * len(self.buckets)
        if self.compression is not None and self.buckets:
            if len(self._flat_grads[0]) > 1:
                raise ValueError("PowerSGD compresses the gradients of one device per worker")
            self._factored = self.compression.plan(
                [(flats[0], [(i, self._params[i].list_grad()[0]) for i in bucket])
                 if self._compressed(self._params[bucket[0]].list_grad()[0]) else None
                 for bucket, flats in zip(self.buckets, self._flat_grads)],
                self._kvstore)
            logger.info("%s", self.compression.describe())
        self._grad_lists = gradient_lists(self._params)
        in_buckets = [self._params[i] for bucket in self.buckets for i in bucket]
        self._views = [(param, device, grad) for param in in_buckets
                       for device, grad in enumerate(param.list_grad())]
        self._bucketed_data = [param.list_data()[device] for param, device, _ in self._views]
        self._addresses = bound_gradient_addresses(self._bucketed_data)
        self.replans += 1

    def _plan(self) -> List[List[int]]:
        reduced = [i for i, p in enumerate(self._params) if p.grad_req != "null"]
        grads = [self._params[i].list_grad()[0] for i in reduced]
        sizes = [g.size * np.dtype(g.dtype).itemsize for g in grads]
        kinds = [(np.dtype(g.dtype), self._compressed(g)) for g in grads]
        return [[reduced[j] for j in bucket]
                for bucket in plan_buckets(sizes, self._bucket_bytes, kinds)]

    def _compressed(self, grad: mx.nd.NDArray) -> bool:
        return self.compression is not None and self.compression.compresses(grad.shape)

    def _flatten(self, bucket: List[int]) -> List[mx.nd.NDArray]:
        """Move the gradients of `bucket` into one flat buffer per device; return them."""
        params = [self._params[i] for i in bucket]
        flats = []
        for device, ctx in enumerate(params[0].list_ctx()):
            grads = [p.list_grad()[device] for p in params]
            # Allocated here, in this thread, not when the engine gets to a fill (as
            # mx.nd.zeros would): bound_gradient_addresses reads the views' addresses from
            # this thread, and MXNet allocates a not-yet-allocated array on the spot when its
            # address is asked for, racing the engine's own allocation. Seen as a bucket of
            # garbage (parameters up to 1e28) in 3 of 189 runs of tests/dist/bucket_cases.py
            # beside other work (docs/performance.md).
            flat = mx.nd.empty(sum(g.size for g in grads), ctx=ctx, dtype=grads[0].dtype)
            flat[:] = 0
            offset = 0
            for param, grad in zip(params, grads):
                view = flat[offset:offset + grad.size].reshape(grad.shape)
                grad.copyto(view)  # a gradient backward already wrote (store set up lazily)
                if param.grad_req == "add":
                    # A graph that keeps writing `grad` adds to it: start it from zero, so
                    # what it adds can be added to the view (_copy_stray_gradients).
                    grad[:] = 0
                rehome_gradient(param, device, view)
                offset += grad.size
            flats.append(flat)
        return flats

    def _copy_stray_gradients(self) -> None:
        """Bring into the buckets every gradient backward wrote elsewhere than its view.

        A static_alloc graph that ran backward before the buckets existed keeps writing the
        arrays it ran with, and hands those back to autograd. Their values are copied (or,
        under ``grad_req='add'``, added and the array zeroed) into the view, and the view is
        offered to backward again: a graph rebuilt since (``hybridize()`` again, or after a
        forward pass outside ``autograd.record()``) writes into it directly."""
        now = bound_gradient_addresses(self._bucketed_data)
        if now == self._addresses:
            return
        strays = [k for k, (seen, planned) in enumerate(zip(now, self._addresses))
                  if seen != planned]
        # All read before any is offered again: offering marks every device of a parameter.
        written = [bound_gradient(*self._views[k][:2]) for k in strays]
        for k, array in zip(strays, written):
            param, _, view = self._views[k]
            if array is None:
                continue
            if param.grad_req == "add":
                view += array
                array[:] = 0
            else:
                array.copyto(view)
        for k in strays:
            rehome_gradient(*self._views[k])
        self.copied_gradients += len(strays)
        if not self._warned_copies:
            self._warned_copies = True
            logger.warning("%d gradients are written by backward outside their bucket (a "
                           "graph hybridized with static_alloc ran backward before the "
                           "buckets were set up): they are copied in each step until that "
                           "graph is rebuilt. To avoid the copies, set the trainer up before "
                           "the first backward (hvdtrain.broadcast_parameters) or "
                           "hybridize() the net again after its first step.", len(strays))

    def follow_gradients(self) -> bool:
        """Plan the buckets again now if Gluon re-created gradients since the last plan
        (``grad_req`` changed, ``reset_ctx``, ``cast``); returns whether it did.

        Each step does this anyway. Called right after such a change, before the next
        backward pass, it also spares the copies: a graph built from then on (after
        ``hybridize()``) binds the buckets' views, not the arrays Gluon just made."""
        if not (self._bucketed and any(now is not planned for now, planned in
                                       zip(gradient_lists(self._params), self._grad_lists))):
            return False
        self._replan()
        logger.info("gradients were re-created (grad_req, reset_ctx or cast): "
                    "%d gradient buckets planned again", len(self.buckets))
        return True

    def gather_gradients(self) -> None:
        """Bring every gradient into its bucket now, as the exchange does first (planned
        again if Gluon re-created them, copied in if backward wrote one elsewhere): for work
        on :meth:`gradient_buffers` before the exchange (a loss divisor's scaling)."""
        if not self.follow_gradients() and self.buckets:
            self._copy_stray_gradients()

    def gradient_buffers(self, device: int = 0) -> List[mx.nd.NDArray]:
        """Arrays holding every gradient of the `device`-th context once: the buckets'
        flat buffers (each gradient is a view of one), or without buckets each parameter's
        own gradient. After :meth:`allreduce_grads`, the reduced gradients."""
        if self.buckets:
            return [flats[device] for flats in self._flat_grads]
        return [param.list_grad()[device] for param in self._params
                if param.grad_req != "null"]

    def _allreduce_grads(self):
        self.follow_gradients()
        if not self.buckets:
            super()._allreduce_grads()
            return
        self._copy_stray_gradients()
        if self.compression is not None:
            self.compression.start_step_exchange()
        for bucket, flats, factored in zip(self.buckets, self._flat_grads, self._factored):
            # Same rule as the Trainer's per-key priority: earlier layers, needed first by
            # the next forward pass, rank higher in MXNet's engine. The key names the
            # bucket by its first parameter (and the plan): the same on every rank.
            key = f"bucket.{bucket[0]}" + (f".{self.replans}" if self.replans else "")
            if factored is None:
                self._kvstore.pushpull(key, flats, priority=-min(bucket))
            else:  # step() has just set rescale_grad: the divisor of this step's sum
                self.compression.exchange(factored, key, self._optimizer.rescale_grad,
                                          priority=-min(bucket))
        if self.compression is not None:
            self.compression.finish_step()
