"""Sharded optimizer state (ZeRO-1): each rank keeps and applies the optimizer for ~1/N of
the elements.

:class:`ShardedTrainer` is a :class:`~.buckets.BucketedTrainer` whose exchange and update
are split differently. Each step:

1. each bucket's flat gradient buffer is *reduce-scattered*: rank r ends with the sum over
   the ranks of its own slice only (:mod:`.shard_plan`: contiguous, balanced within one
   element, Horovod's own split), through one Horovod all-to-all (every rank sends rank r
   its slice r) and a sum of the parts received, in rank order;
2. rank r applies the user's optimizer object to its slice alone, cut into one piece per
   parameter it touches (each a flat view of that parameter's weight, with the parameter's
   own index: its ``lr_mult``/``wd_mult``, update count and rate schedule), scaled by the
   Trainer's ``rescale_grad`` (the global sample count) as before; the optimizer state it
   creates is that of its pieces, about 1/N of the model's;
3. the bucket's updated slices are *all-gathered* into every rank's weights;

bucket after bucket, every call queued in MXNet's engine and none waited for; steps 1 and 3
chunk by chunk (:mod:`.shard_exchange`), through buffers made once a plan, each at most
``chunk_mb`` MiB (and no larger than ``bucket_mb``) whatever the largest parameter, the
sum arriving in the bucket's own gradient buffer.

A reduce-scatter and an all-gather move the bytes of one allreduce (which is exactly a
reduce-scatter then an all-gather in a ring); the all-to-all sends what a ring's
reduce-scatter sends, (N-1)/N of the bucket from each rank. Horovod's own reduce-scatter
(Open MPI's ``MPI_Reduce_scatter``) took twice an allreduce's time on this host, its
all-to-all less than half of one (docs/performance.md). What is updated is, element by element, what
the unsharded Trainer updates, with the same elementwise kernels: the weights end equal
(docs/performance.md, "Sharded optimizer state").

The sharded state lives in an updater of this trainer's own (:attr:`shard_updater`), not in
``Trainer._updaters``: what compares or copies the replicated state (the replica check)
sees none, and refuses rather than copy a partial state. Checkpoints and elastic commits
hold the whole state (:mod:`.shard_checkpoint`): :meth:`ShardedTrainer.whole_states_later`
gathers it on every rank (a collective; for a save, on rank 0 alone, streamed into the file
chunk by chunk), and ``save_states``, on every rank too, writes it in
``Trainer.save_states``'s own format; ``load_states`` and :meth:`set_whole_states` take
a whole state, saved at any world size, sharded or not, and this rank's pieces are cut out
of it before the next step, at the world size there is then (after an elastic reset: the
slices planned again for the new ranks). Until the next update the trainer keeps the whole
state it last gathered or took, so that a rank alone (an elastic sync's rank 0) can give it
without a collective. Every rank keeps every parameter's update count (those it updates no
piece of too), so the optimizer object a checkpoint holds is whole. Only optimizers whose state and update are per element are taken
(:data:`SHARDABLE`); one rank's pieces of a parameter get the parameter's multipliers, and
no update reads another element.
"""
from __future__ import annotations

import os
import pickle
from typing import List, Optional, Tuple

import mxnet as mx
import numpy as np
from mxnet import optimizer as opt

from ..config import ConfigError
from ..ecosystem import SHARDABLE_OPTIMIZERS
from .buckets import BucketedTrainer
from .gluon_internals import (StatesLater, amp_scaler, amp_skips_update, frozen_optimizer,
                              states_later)
from .shard_checkpoint import check_shapes, gather_whole, sliced
from .shard_exchange import CHUNK_MB, BucketExchange, plan_exchanges
from .shard_states_file import GuardedFile, write_skeleton
from .shard_lamb import lamb_update
from .shard_plan import Piece, plan_shards, shard_bounds
from .shard_state import WholeStateRefused, state_bytes
from ..state.background import put_states
from ..state.writes import OutputError, atomic_write
from .dist import DistContext

# Optimizers whose update of an element reads only that element (its weight, gradient and
# state) and per-parameter scalars (rate, decay, update count): exact on any slice. LAMB
# (a whole parameter's norms) is taken by shard_lamb.py; LARS/LBSGD (layer norms), Nadam (a
# schedule advanced by every call), DCASGD/SGLD/Ftrl/Adamax and users' own classes are not.
NORM_CHUNK = 2 ** 20  # values per float32 dot product of a squared norm
AMP_CHUNK = 200  # arrays per multi_all_finite call (as MXNet's LossScaler checks them)

SHARDABLE = (opt.SGD, opt.NAG, opt.Adam, opt.RMSProp, opt.AdaGrad, opt.AdaDelta, opt.FTML,
             opt.Signum)



def check_shardable(optimizer) -> None:
    """Refuse, in one line, an optimizer whose update is not per element (LAMB aside: its
    norms are summed over the ranks, :mod:`.shard_lamb`)."""
    kind = type(optimizer)
    if f"{kind.__module__}.{kind.__qualname__}" in SHARDABLE_OPTIMIZERS:  # GluonNLP's
        return
    if kind not in SHARDABLE + (opt.LAMB,):
        raise ConfigError(
            f"shard_optimizer updates slices of parameters, exact only for optimizers whose "
            f"state and update are per element ({', '.join(c.__name__ for c in SHARDABLE)}, "
            f"GluonNLP's BERTAdam) and LAMB; {kind.__name__} is not one of them: use one, or "
            f"drop shard_optimizer")


class ShardedTrainer(BucketedTrainer):
    """A :class:`~.buckets.BucketedTrainer` whose optimizer state is sharded over the ranks.

    Parameters
    ----------
    *args, **kwargs
        As :class:`~.buckets.BucketedTrainer` (``bucket_mb`` above 0, no ``compression``),
        on the ``horovod`` store with ``update_on_kvstore=False``, one device per rank.
    chunk_mb : float, optional
        The bound of each temporary buffer of the exchange, in MiB (default
        :data:`~.shard_exchange.CHUNK_MB`; ``bucket_mb`` where that is smaller): a bucket
        larger than it (a large parameter is a bucket alone) is exchanged chunk by chunk.

    Attributes
    ----------
    shard_updater : mxnet.optimizer.Updater
        The optimizer state of this rank's pieces, keyed by parameter position.
    pieces : list of list of Piece
        Per bucket, the pieces of parameters this rank updates.
    """

    def __init__(self, *args, chunk_mb: Optional[float] = None, **kwargs):
        if kwargs.get("compression") is not None:
            raise ConfigError("shard_optimizer exchanges whole slices of the gradient "
                              "buckets: drop compression='powersgd'")
        self.pieces: List[List[Piece]] = []
        self._weight_views: List[List[mx.nd.NDArray]] = []
        self._slice_sizes: List[int] = []  # per bucket, the elements of this rank's slice
        self._layout = None  # what the pieces were planned from
        # Per bucket, its chunked exchange (None: fewer elements than ranks, or one rank).
        self._exchanges: List[Optional[BucketExchange]] = []
        self._exchange_buffers: List[mx.nd.NDArray] = []  # what they share
        self._slice_views: List[list] = []  # per bucket, its pieces' gradient views
        self._small: List[bool] = []
        self._loaded = None  # a whole state taken, its slices not yet cut (at the next step)
        # The whole state as it is, known without a collective: since the last gather or
        # load, before any update ({}: a new trainer's, nothing updated yet).
        self._resting: Optional[dict] = {}
        self._scattered = None  # per bucket, the slice scatter_gradients() made for update()
        self._unowned: List[int] = []  # trained parameters this rank holds no piece of
        self._half_wire = False  # --fp16-allreduce: the reduce-scatter sends float16
        self.chunk_mb = CHUNK_MB if chunk_mb is None else chunk_mb
        super().__init__(*args, **kwargs)
        check_shardable(self._optimizer)
        if len(self._contexts) > 1:
            raise ConfigError("shard_optimizer shards one device's state per rank: run one "
                              "rank per device (horovodrun -np <devices>)")
        self.shard_updater = opt.get_updater(self._optimizer)
        # The Trainer's own updater never runs; it holds no state, and refuses to save or
        # load one (Trainer.save_states, a CheckpointHandler, an elastic commit) rather than
        # write an empty state or load a whole one no slice would read.
        self._updaters = [WholeStateRefused(self._optimizer)]

    def _init_kvstore(self):
        super()._init_kvstore()
        store = self._kvstore
        if store is None or store.type != "horovod" or self._update_on_kvstore:
            raise ConfigError("shard_optimizer reduce-scatters through Horovod: it needs the "
                              "horovod store with update_on_kvstore=False")
        if not self.buckets and any(p.grad_req != "null" for p in self._params):
            raise ConfigError("shard_optimizer slices the gradient buckets: bucket_mb must be "
                              "above 0 and every gradient dense")

    def _replan(self) -> None:
        # The buckets change under a sliced state (a frozen backbone starts to train:
        # --freeze-epochs; every rank replans at the same point, grad_req changing alike):
        # the whole state is gathered under the old plan, and cut again under the new one.
        if self._layout is not None and self.shard_updater.states and self._loaded is None:
            self.whole_states_later()  # a gather, unless nothing was updated since
            self._loaded = self._resting
        super()._replan()
        self._plan_slices()

    def _plan_slices(self) -> None:
        """Cut the buckets into this rank's pieces, for the ranks there are now, and make
        the buffers of the exchange (the buckets themselves are the ranks' alike: an
        elastic reset plans only this again, so a static graph keeps writing its
        gradients into them)."""
        rank, ranks = self._world()
        sizes = [[self._params[i].list_data()[0].size for i in bucket]
                 for bucket in self.buckets]
        layout = ([list(b) for b in self.buckets], sizes, rank, ranks)
        if (self._layout is not None and layout != self._layout and self.shard_updater.states
                and self._loaded is None):
            raise RuntimeError("shard_optimizer: the gradient buckets changed after the "
                               "optimizer state was sliced (parameters re-created with other "
                               "shapes or ranks); set grad_req, cast and reset_ctx before the "
                               "first step")
        self._layout = layout
        self.pieces = plan_shards(self.buckets, sizes, rank, ranks)
        self._slice_sizes = [sum(p.size for p in pieces) for pieces in self.pieces]
        owned = {piece.param for pieces in self.pieces for piece in pieces}
        self._unowned = [i for bucket in self.buckets for i in bucket if i not in owned]
        self._weight_views = [[self._params[p.param].list_data()[0].reshape(-1)[p.start:p.stop]
                               for p in pieces] for pieces in self.pieces]
        self._plan_buffers([sum(bucket_sizes) for bucket_sizes in sizes], ranks)
        if self._loaded is not None:
            self._take_slices(self._loaded)

    def _plan_buffers(self, totals: List[int], ranks: int) -> None:
        """Each bucket's exchange, chunk by chunk through buffers made once a plan and
        shared by the buckets (:mod:`.shard_exchange`: each at most :attr:`chunk_mb` MiB,
        and no larger than a bucket), and the views of each piece's gradient: its part of
        this rank's slice of the bucket's gradient buffer, where the sum arrives."""
        # A bucket of fewer elements than ranks leaves some rank a slice of nothing, which
        # MXNet cannot allocate: Horovod's own calls size those (a few elements a step).
        self._small = [total < ranks for total in totals]
        self._half_wire = ranks > 1 and getattr(self._kvstore, "compression", "none") == "fp16"
        flats = [flats[0] for flats in self._flat_grads]
        self._exchanges, self._exchange_buffers = [None] * len(self.buckets), []
        if ranks > 1:
            chunk = min(self.chunk_mb, self._bucket_bytes / 2 ** 20) * 2 ** 20
            self._exchanges, self._exchange_buffers = plan_exchanges(
                flats, [[self._params[i].list_data()[0] for i in bucket]
                        for bucket in self.buckets], self._world()[0], ranks, chunk,
                self._half_wire, [self._tag(b) for b in range(len(self.buckets))],
                [-min(bucket) for bucket in self.buckets])
        self._slice_views = []
        for flat, pieces, exchange in zip(flats, self.pieces, self._exchanges):
            own = flat if exchange is None else exchange.own
            self._slice_views.append([own[p.offset:p.offset + p.size] for p in pieces])

    @property
    def _ranks(self) -> int:
        return self._kvstore.num_workers

    def _world(self) -> Tuple[int, int]:
        store = self._kvstore
        return (store.rank, store.num_workers) if store is not None else (0, 1)

    def _settle(self) -> None:
        """Before a step or a gather: the slices planned for the ranks there are now (after
        an elastic reset, Horovod re-initialised on other workers: planned again, and their
        collectives named as a joining worker's first plan names them), and this rank's
        pieces cut out of a whole state taken since."""
        if self._layout is not None and self._world() != tuple(self._layout[2:]):
            # The whole state: one taken (an elastic sync's, a restore's), or else the one
            # gathered last, if nothing was updated since (a commit that found hosts only
            # removed: Horovod's loop then resets without a sync).
            whole = self._loaded if self._loaded is not None else self._resting
            if whole is None:
                raise RuntimeError("shard_optimizer: the ranks changed and the whole "
                                   "optimizer state is known nowhere (updated since it was "
                                   "last gathered or taken): this rank's slices cannot be "
                                   "planned again; commit the elastic state before a reset")
            self._loaded = whole
            self.replans = 0  # the collectives named as a joining worker's first plan
            self._plan_slices()  # cuts the pieces out of the whole state
        elif self._loaded is not None and self._layout is not None:
            self._take_slices(self._loaded)

    def allreduce_grads(self):
        """Refused: the sharded exchange reduces each rank's slice only, inside the update,
        so no rank ever holds the whole reduced gradient (a norm, a clip, a check of it)."""
        raise NotImplementedError("shard_optimizer reduce-scatters the gradients inside "
                                  "step(): no rank holds the whole reduced gradient to work "
                                  "on between allreduce_grads() and update(); call step(), "
                                  "or drop shard_optimizer")

    def _allreduce_grads(self):
        # The exchange is the update's (each bucket reduce-scattered, updated and gathered
        # in turn, through shared buffers): here, only the gradients brought into buckets.
        self._settle()
        self.follow_gradients()
        if self.buckets:
            self._copy_stray_gradients()

    def _update(self, ignore_stale_grad=False):
        # Gluon skips a parameter whose gradient is stale on this rank (ignore_stale_grad);
        # here every rank updates slices of every parameter with the sum of every rank's
        # gradients, so no rank can skip one alone: refused instead.
        # The verdict is every rank's (one small collective): a stale rank refusing alone
        # would leave the others in the exchange until the stall timeout.
        stale = None
        for param in self._params:
            if param.grad_req == "null":
                continue
            for data in param.list_data():
                if not data._fresh_grad and stale is None:  # pylint: disable=protected-access
                    stale = UserWarning(
                        f"Gradient of Parameter `{param.name}` on context {data.context} has "
                        f"not been updated by backward since last `step`; with "
                        f"shard_optimizer no rank can skip a parameter alone "
                        f"(ignore_stale_grad): give every trained parameter a gradient each "
                        f"step (grad_req='null' for those that take none), or drop "
                        f"shard_optimizer")
                data._fresh_grad = False  # pylint: disable=protected-access
        try:
            DistContext.from_store(self._kvstore).agree("shard_stale", stale)
        except mx.base.MXNetError as err:
            # Only a lost peer fails this sum (Horovod shut down): said as a failed
            # collective inside a step is, so that an elastic loop rolls back and resets.
            # Imported here: importing horovod at hvdtrain's import is refused (test_layout).
            from horovod.common import exceptions  # pylint: disable=import-outside-toplevel
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            raise exceptions.HorovodInternalError(lines[-1] if lines else "shard_stale") \
                from err
        self._settle()
        self._resting = None  # from here on only a gather knows the whole state
        self.shard_updater.optimizer = self._optimizer
        if amp_scaler(self) is not None:  # Trainer._update's check, over the ranks' slices
            if self._scattered is None:
                self._scatter_all()
            if amp_skips_update(self, self._overflowed()):
                self._scattered = None
                return
        scattered, self._scattered = self._scattered, None
        for b in range(len(self.buckets)):
            self._step_bucket(b, None if scattered is None else scattered[b])
        # Every rank counts every update, of parameters it holds no piece of too: the
        # optimizer object a checkpoint saves (rank 0's) is then every parameter's.
        if self._unowned:
            self._optimizer._update_count(self._unowned)  # pylint: disable=protected-access

    @property
    def _plan_suffix(self) -> str:
        """The end of this plan's collectives' names: a new plan, new names."""
        return f".{self.replans}" if self.replans else ""

    def _tag(self, b: int) -> str:
        """Bucket `b`'s part of its collectives' names."""
        return f"{self.buckets[b][0]}{self._plan_suffix}"

    def _scatter(self, b: int) -> mx.nd.NDArray:
        """Bucket `b`'s gradient summed over the ranks, this rank's slice of it: in the
        bucket's own gradient buffer (:mod:`.shard_exchange`), or for a bucket of fewer
        elements than ranks a new array."""
        flat = self._flat_grads[b][0]
        if self._ranks == 1:
            return flat
        if not self._small[b]:
            return self._exchanges[b].scatter()
        hvd = self._kvstore._hvd  # pylint: disable=protected-access
        name = f"shard.reducescatter.{self._tag(b)}"
        if not (self._half_wire and flat.dtype == np.float32):
            return hvd.reducescatter(flat, op=hvd.Sum, name=name)
        return hvd.reducescatter(flat.astype(np.float16), op=hvd.Sum,
                                 name=name).astype(np.float32)

    def scatter_gradients(self) -> mx.nd.NDArray:
        """Reduce-scatter every bucket now (each into a slice buffer of its own, about 1/N
        of the gradients, made at the first call of a plan) and return this rank's sum of
        squares of its slices, float32 on the CPU: summed over the ranks, the squared norm of
        the summed gradient (each element is one rank's). The next ``update()`` applies
        these slices. For ``--clip-grad-norm`` (loop/recipe/clipping.py), which must know
        the whole norm before any slice is updated."""
        self._scatter_all()
        # A dot per chunk: float32 sums of millions of values lose digits (as the
        # unsharded norm, loop/recipe/clipping.py).
        squares = [mx.nd.dot(flat[i:i + NORM_CHUNK], flat[i:i + NORM_CHUNK]).as_in_context(
            mx.cpu()) for flat in (grad.reshape((-1,)).astype("float32", copy=False)
                                   for grad in self._scattered)
            for i in range(0, flat.size, NORM_CHUNK)]
        if not squares:
            return mx.nd.zeros(1, ctx=mx.cpu())
        return mx.nd.add_n(*squares) if len(squares) > 1 else squares[0]

    def _scatter_all(self) -> None:
        """Reduce-scatter every bucket (each sum stays in its bucket's gradient buffer),
        for the next ``update()``."""
        self._allreduce_grads()
        self._scattered = [self._scatter(b) for b in range(len(self.buckets))]

    def _overflowed(self) -> bool:
        """Whether any element of any rank's scattered slices is not finite (AMP's check of
        the summed gradient, made of every rank's part of it: the same on every rank)."""
        slices = [grad for grad in self._scattered if grad.size]
        finite = mx.nd.ones((1,), ctx=self._contexts[0])
        for i in range(0, len(slices), AMP_CHUNK):
            part = slices[i:i + AMP_CHUNK]
            mx.nd.multi_all_finite(*part, num_arrays=len(part), init_output=False,
                                   out=finite)
        bad = 1 - finite
        if self._ranks > 1:
            self._kvstore.sum_exact("shard.overflow" + self._plan_suffix, bad)
        return bool(bad.asscalar() > 0)

    def _step_bucket(self, b: int, grad=None) -> None:
        """Reduce-scatter bucket `b` (unless `grad`, its slice, was already), update this
        rank's slice of it, gather its weights: each call queued (MXNet's engine runs them
        in order), none waited for."""
        bucket, pieces, views = self.buckets[b], self.pieces[b], self._weight_views[b]
        hvd = self._kvstore._hvd  # pylint: disable=protected-access
        tag = self._tag(b)
        if grad is None:
            grad = self._scatter(b)
        indices = [piece.param for piece in pieces]
        grads = [grad[piece.offset:piece.offset + piece.size] for piece in pieces] \
            if self._small[b] else self._slice_views[b]
        if isinstance(self._optimizer, opt.LAMB):  # every rank: its norms are a collective
            lamb_update(self._optimizer, self.shard_updater.states, indices, grads, views,
                        len(self._params), lambda v: self._sum_over_ranks(v, tag),
                        self._contexts[0])
        elif indices:
            self.shard_updater(indices, grads, views)
        if self._ranks == 1:
            return
        for view, part in zip(views, grads):  # the slice's gradient is read: it now sends
            view.copyto(part)
        if not self._small[b]:
            self._exchanges[b].gather()
            return
        whole = hvd.allgather(grad, name=f"shard.allgather.{tag}")
        offset = 0
        for i in bucket:
            data = self._params[i].list_data()[0]
            whole[offset:offset + data.size].reshape(data.shape).copyto(data)
            offset += data.size

    def _sum_over_ranks(self, vector: mx.nd.NDArray, tag: str) -> None:
        if self._ranks > 1:
            self._kvstore.sum_exact(f"shard.norms.{tag}", vector)

    def exchange_buffer_bytes(self) -> List[int]:
        """Bytes of each temporary buffer of the exchange (made once a plan)."""
        return [buf.size * np.dtype(buf.dtype).itemsize for buf in self._exchange_buffers]

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds."""
        if self._kv_initialized:
            self._settle()
        return state_bytes(self.shard_updater.states)

    def whole_states_later(self, alone: bool = False, to_root: bool = False,
                           into: Optional[str] = None) -> Optional[StatesLater]:
        """Every rank: the whole optimizer state, gathered from every rank's slices (a
        collective), with the optimizer object; calling the result gives the bytes an
        unsharded ``Trainer.save_states`` writes (:mod:`.shard_checkpoint`). No update since
        the last gather or load: that state, without a collective (every rank alike).

        Parameters
        ----------
        alone : bool
            Called by one rank only (an elastic sync's rank 0): the state must be known
            without a collective, or RuntimeError (a gather would wait for ever).
        to_root : bool
            Gathered on rank 0 alone (a save, which rank 0 writes), chunk by chunk (about
            :attr:`chunk_mb` a call): the other ranks send their slices, hold no more than
            those and a chunk, and get None; no rank keeps the state after.
        into : str, optional
            With `to_root`, on rank 0: stream the state into this file as it arrives
            (:mod:`.shard_states_file`; rank 0 never holds it whole either) and return a
            :class:`~.shard_states_file.WrittenStates` of it."""
        if self._resting is not None:
            return states_later(self._resting, self._optimizer, copy=False)
        if alone:
            raise RuntimeError("shard_optimizer: the optimizer state was updated since it "
                               "was last gathered (an elastic commit gathers it on every "
                               "rank), and one rank alone cannot gather it: commit before "
                               "a sync")
        if not self._kv_initialized:
            self._init_kvstore()
        self._settle()
        store, ranks = self._kvstore, self._ranks  # the horovod store: _init_kvstore checks
        hvd = store._hvd  # pylint: disable=protected-access
        ctx = self._contexts[0]
        tag = self._plan_suffix

        to_root = to_root and ranks > 1

        def allgather(vector, name):
            array = mx.nd.array(vector, ctx=mx.cpu(), dtype=vector.dtype)
            if not to_root:
                return hvd.allgather(array, name=name + tag).asnumpy()
            # Rank 0's: every rank sends it its chunk, and the others nothing (an
            # all-to-all). The splits copied in now: Horovod reads them when the call runs,
            # and an array MXNet's engine still computes was read unwritten (a crash).
            splits = mx.nd.array([vector.size] + [0] * (ranks - 1), ctx=mx.cpu(),
                                 dtype=np.int32)
            ends, _ = hvd.alltoall(array, splits=splits, name=name + tag)
            return ends.asnumpy() if store.rank == 0 else None

        def present(counts):
            if ranks > 1:
                summed = mx.nd.array(counts, ctx=ctx)
                store.sum_exact("shard.state.held" + tag, summed)
                return summed.asnumpy()
            return counts

        def template(index):
            data = self._params[index].list_data()[0]
            return self._optimizer.create_state_multi_precision(
                index, mx.nd.zeros((1,), ctx=mx.cpu(), dtype=data.dtype))

        shapes = [param.shape for param in self._params]
        out = GuardedFile(into) if into is not None and to_root and store.rank == 0 else None

        def skeleton(spaces):
            optimizer = pickle.loads(frozen_optimizer(self._optimizer))
            out.run(lambda: write_skeleton(out, spaces, optimizer))
            return out

        whole = gather_whole(
            self.buckets, shapes, self.pieces, self.shard_updater.states, template,
            store.rank, ranks, allgather, present,
            max(1, int(self.chunk_mb * 2 ** 20) // 4 // ranks) if to_root else None,
            "shard.state.root" if to_root else "shard.state",
            skeleton if out is not None else None)
        if out is not None:
            return out.close()
        if to_root:
            return None if whole is None else states_later(whole, self._optimizer, copy=False)
        self._resting = whole  # host copies of their own: training does not change them
        return states_later(whole, self._optimizer, copy=False)

    def save_states(self, fname):
        """``Trainer.save_states``, on every rank (it gathers: a collective): the whole
        state, in an unsharded run's format, written by rank 0 alone (atomically: a reader
        sees the old file or the new one); a failed write stops every rank alike.

        Horovod's idiom ``if hvd.rank() == 0: trainer.save_states(f)`` cannot work here:
        rank 0 waits at the gather for slices the others never send, until a watchdog's
        stall timeout or Horovod's stall shutdown ends the job (docs/performance.md,
        "Sharded optimizer state"). Call it on every rank."""
        states = self.whole_states_later(to_root=True, into=f"{fname}.{os.getpid()}.part")
        store = self._kvstore
        failed = None
        if store is None or store.rank == 0:
            try:
                atomic_write(fname, lambda tmp: put_states(states, tmp))
            except OutputError as err:
                failed = err
        DistContext.from_store(store).agree("shard_save", failed)

    def load_states(self, fname):
        """``Trainer.load_states``, on every rank: this rank's slices of the whole state in
        `fname` (written by a sharded or unsharded run, at any world size)."""
        if not self._kv_initialized:
            self._init_kvstore()
        if self._params_to_init:
            self._init_params()
        with open(fname, "rb") as src:
            self.set_whole_states(src.read())

    def set_whole_states(self, blob: bytes) -> None:
        """Take the optimizer object and the whole state pickled in `blob`
        (``Trainer.save_states``'s bytes); this rank's slices of it are cut at the next
        step or gather, for the ranks there are then. No collective, and no call to Horovod:
        an elastic restore runs it on the survivors of a failed one, before the reset."""
        loaded = pickle.loads(blob)
        states, optimizer = loaded if isinstance(loaded, tuple) and len(loaded) == 2 \
            else (loaded, self._optimizer)
        self._optimizer = optimizer
        optimizer.param_dict = dict(enumerate(self._params))
        self._updaters = [WholeStateRefused(optimizer)]
        self.shard_updater = opt.get_updater(optimizer)
        check_shapes(states, [param.shape for param in self._params])
        self._loaded = self._resting = states
        self._scattered = None  # a slice scattered before belongs to the state undone

    def _take_slices(self, whole: dict) -> None:
        # Checked again now that every shape is known (a state taken before a deferred
        # initialisation was checked only where shapes were known then).
        check_shapes(whole, [param.shape for param in self._params])
        self.shard_updater.states = sliced(whole, self.pieces, self._contexts[0])
        self.shard_updater.states_synced = dict.fromkeys(self.shard_updater.states, True)
        self._loaded = None
