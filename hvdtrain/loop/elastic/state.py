"""Elastic training state for a Gluon net and trainer, on ``horovod.common.elastic``.

Horovod ships elastic state for PyTorch and TensorFlow but none for MXNet. :class:`GluonState`
fills that gap the way Horovod's own states work: :meth:`commit` copies everything a rollback
needs into host memory; after a rank fails, the survivors :meth:`restore` the last commit;
after every reset, :meth:`sync` makes rank 0's copy everyone's (new ranks included).

What one commit holds:

- every array of the net (``collect_params()``: weights and BatchNorm running statistics);
- the optimizer: its per-parameter states (momentum, Adam's moments) and the optimizer
  object itself (update counts, the learning-rate scheduler), as
  ``Trainer.save_states`` would write them, but in memory; under ``shard_optimizer`` the
  whole state, gathered from every rank's slices at each commit (a lost rank's slices are
  then in every survivor's commit), and cut into slices for the new ranks after a reset;
- AMP's dynamic loss scale (:mod:`hvdtrain.state.loss_scale`);
- ``--ema``'s moving average of the model, when there is one (:mod:`hvdtrain.loop.recipe.ema`);
- the position, a :class:`~hvdtrain.state.train_state.TrainState` (epoch, step, samples
  of the epoch already trained), plus any plain values passed as keywords.

A restore and a sync also zero every gradient (in place: the buckets hold them as views):
a commit is taken between steps, where none is pending, and the undone attempt's
micro-batches must not reach the next step's update. PowerSGD's per-rank errors are reset
too (:func:`hvdtrain.state.compression_state.reset`).

The spike in ``docs/elastic.md`` showed that writing the restored values into the existing
arrays is enough after a failed allreduce: the engine's error is raised once (by
``mx.nd.waitall()``) and the arrays take new values afterwards.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Dict, Optional

import mxnet as mx
import numpy as np
from horovod.common.elastic import ObjectState

from ...runtime.elastic_run import collective_errors, drain_engine
from ...state import compression_state
from ...state.loss_scale import loss_scale_state, restore_loss_scale
from ...state.train_state import TrainState
from ...store.agree import fault_point
from ...store.broadcast import broadcast_object
from ...store.sites import FAULT_ENV
from ...store.gluon_internals import (discard_gradients, optimizer_states, params_by_place,
                                     set_optimizer_states, skip_first_step_broadcast, store_of,
                                     updates_on_store)

# Every rank must name a broadcast alike (ranks that pass different names wait on each other
# for ever): the name is built from what is sent, the same on every rank.
_BCAST_NAME = "hvdtrain.elastic.{}"


def _horovod_bcast(obj, name):
    import horovod.mxnet as hvd
    if hvd.size() == 1:
        return obj  # alone, rank 0's object is this one
    # A peer lost during a commit's or a sync's broadcast must roll back like one lost
    # during a step, not end this worker with an MXNetError.
    with collective_errors():
        # Not horovod.mxnet's broadcast_object, which can crash (store/broadcast.py). This
        # one has completed on every rank when it returns, so a commit is a point every rank
        # has passed (a rank 0 that finished and shut Horovod down with its last broadcast
        # still queued failed a slower rank).
        return broadcast_object(hvd, obj, name)


def _horovod_rank():
    import horovod.mxnet as hvd
    return hvd.rank()


class GluonState(ObjectState):
    """A Gluon net, its trainer and the training position, committed in host memory.

    Parameters
    ----------
    net : mxnet.gluon.Block
        The model; its parameters must be initialised (shapes known).
    trainer : mxnet.gluon.Trainer
        Its trainer, updating on the workers (``update_on_kvstore=False``), as every
        synchronous Horovod trainer does.
    position : TrainState, optional
        Where training stands; read and set through ``state.position``.
    bcast_object : callable, optional
        ``bcast_object(obj, name) -> obj``: rank 0's `obj` on every rank. By default
        :func:`hvdtrain.store.broadcast.broadcast_object` on Horovod.
    get_rank : callable, optional
        This worker's rank. Horovod's ``rank`` by default.
    ema : WeightAverage, optional
        A moving average of the model's arrays, committed and restored with them.
    **values
        Plain Python values committed and restored with the rest, as attributes.
    """

    def __init__(self, net, trainer, position: Optional[TrainState] = None,
                 bcast_object: Optional[Callable] = None, get_rank: Optional[Callable] = None,
                 ema=None, **values):
        if updates_on_store(trainer):
            raise ValueError("elastic state needs a trainer that updates on the workers "
                             "(update_on_kvstore=False): the store would hold the optimizer")
        if not _store_is_elastic(trainer):
            store, _ = store_of(trainer)
            raise ValueError("elastic state needs a Horovod store or none (horovod.mxnet's "
                             f"DistributedTrainer), not {getattr(store, 'type', store)!r}")
        self.net, self.trainer, self.ema = net, trainer, ema
        self.position = dataclasses.replace(position) if position else TrainState()
        self._bcast = bcast_object or _horovod_bcast
        self._saved_arrays: Dict[str, np.ndarray] = {}
        self._saved_optimizer = b""  # bytes, or a uint8 array of them after a sync
        self._saved_loss_scale: dict = {}
        self._saved_ema: Dict[str, np.ndarray] = {}
        self._saved_position = TrainState()
        self._save_model()
        # Horovod's State broadcasts a tuple (host updates), ObjectState a dict (the values):
        # named after the type, as every rank passes the same type.
        super().__init__(bcast_object=lambda obj: self._bcast(
                             obj, _BCAST_NAME.format(type(obj).__name__)),
                         get_rank=get_rank or _horovod_rank, **values)

    # --- horovod.common.elastic.State -----------------------------------------------------

    def save(self):
        """Copy the net, the optimizer, the loss scale and the position to host memory."""
        self._save_model()
        super().save()

    def restore(self):
        """Put the last commit back, undoing every step since (and every gradient of the
        step under way)."""
        # Horovod's run_fn restores before its reset drains the engine, and the engine
        # skips writes to arrays a failed collective left marked: drain first.
        drain_engine()
        self._load_model(self._saved_arrays, self._saved_optimizer, self._saved_loss_scale,
                         self._saved_position, self._saved_ema)
        super().restore()

    def sync(self):
        """Make rank 0's last commit every rank's, in the commit and in the live objects.

        Rank 0 first commits what it holds (after :meth:`restore` that is its last commit;
        at the start it is the initial state), so a worker that joins takes over the running
        job's parameters, optimizer and position. The other ranks send nothing (their
        side of the broadcast is ignored), and copy nothing before they receive: a sync
        adds about one copy of the state on any rank (rank 0's fresh commit, or what the
        others receive), plus a few chunks of the broadcast."""
        sent = None
        if self._rank() == 0:
            # Alone: a sharded trainer's whole state is the one its last commit gathered
            # (or a restore or a load took), which it keeps until its next update.
            self._save_model(alone=True)
            # The optimizer's blob goes as a uint8 array, a view of the bytes: the broadcast
            # then sends it from where it lies and a receiver keeps it where it arrived, as
            # the net's arrays (as bytes it was copied once more on either side).
            sent = (self._saved_arrays, np.frombuffer(self._saved_optimizer, dtype=np.uint8),
                    self._saved_loss_scale, dataclasses.asdict(self._saved_position),
                    self._saved_ema)
        saved = self._bcast(sent, _BCAST_NAME.format("model"))
        arrays, optimizer, loss_scale, position, ema = saved
        skip_first_step_broadcast(self.trainer)
        self._saved_arrays, self._saved_optimizer = arrays, optimizer
        self._saved_loss_scale, self._saved_position = loss_scale, TrainState(**position)
        self._saved_ema = ema
        self._load_model(arrays, optimizer, loss_scale, self._saved_position, ema)
        super().sync()

    # --- the MXNet side ---------------------------------------------------------------------

    def _save_model(self, alone: bool = False):
        # Everything into locals first, then assigned together: a peer lost inside the
        # gather below leaves the previous commit whole (never this step's weights beside
        # the last commit's optimizer state, position and EMA).
        # asnumpy() waits for the engine: the copy is of finished values, never of arrays
        # that an update still writes.
        arrays = {name: p.data().asnumpy() for name, p in params_by_place(self.net).items()}
        if FAULT_ENV in os.environ and hasattr(self, "_rank"):  # the fault test's switch
            fault_point("elastic.commit", self._rank())
        # A sharded trainer's is gathered from every rank's slices (a collective: a commit
        # is one every rank makes), or known without one (`alone`, store/sharded.py).
        optimizer = optimizer_states(self.trainer, alone=alone)
        loss_scale = loss_scale_state(self.trainer)
        position = dataclasses.replace(self.position)
        ema = self.ema.state() if self.ema is not None else {}
        (self._saved_arrays, self._saved_optimizer, self._saved_loss_scale,
         self._saved_position, self._saved_ema) = arrays, optimizer, loss_scale, position, ema

    def _load_model(self, arrays, optimizer, loss_scale, position, ema):
        params = params_by_place(self.net)
        missing = sorted(set(params.keys()) ^ set(arrays))
        if missing:
            raise ValueError(f"elastic state does not match the net: {missing[:3]}")
        for name, p in params.items():
            # Through an NDArray, not from NumPy straight (``arr[:] = numpy``): that
            # synchronous copy fails on a weight MKL-DNN holds in its own layout ("We can't
            # generate TBlob for MKLDNN data", a convolution after its first step).
            p.set_data(mx.nd.array(arrays[name], dtype=arrays[name].dtype))
        # A commit is taken between steps, where no gradient is pending. The undone attempt
        # may have left micro-batches summed (grad_req='add'), possibly half reduced, and
        # neither backward nor the epoch would ever zero them: the first step would add them.
        discard_gradients(params.values())
        # PowerSGD's errors belong to the ranks of the attempt undone (some may be gone, a
        # new one has none): every rank starts them from zero, and Q from its seed.
        compression_state.reset(self.trainer, position.step)
        set_optimizer_states(self.trainer, optimizer)
        restore_loss_scale(self.trainer, loss_scale)
        if self.ema is not None:
            self.ema.set_state(ema)
        self.position = dataclasses.replace(position)


def _store_is_elastic(trainer) -> bool:
    """A Horovod store, or none: a store name on one device creates no store (``'device'``,
    Gluon's default). MXNet's own stores register every key at the first step's broadcast,
    which a sync skips (``skip_first_step_broadcast``)."""
    store, contexts = store_of(trainer)
    if isinstance(store, str):
        return "dist" not in store and len(contexts) == 1
    return store is None or getattr(store, "type", None) == "horovod"
