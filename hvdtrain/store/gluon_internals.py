"""The private corners of MXNet 1.9's Gluon that hvdtrain relies on, in one place.

Gluon has no public way to set up a Trainer's store before its first step
(:func:`set_up_store`), to give a parameter a gradient array of the caller's choosing
(:func:`rehome_gradient`), or to see which array backward will really write a gradient into
(:func:`bound_gradient_addresses`), nor to hold a Trainer's optimizer state in memory,
skip its first-step broadcast or discard an undone attempt's gradients (the elastic state:
:func:`optimizer_states`, :func:`set_optimizer_states`, :func:`skip_first_step_broadcast`,
:func:`discard_gradients`), nor to copy a model and its optimizer state for a background
save (:func:`host_arrays`, :func:`optimizer_states_later`), nor to say where the model zoo's
files are downloaded from (:func:`model_store_url`, for ``--pretrained``'s advice offline),
nor to give every rank AMP's loss scale for an update whether or not it ran a backward pass
(:func:`set_loss_scale`), nor to tell a running statistic from a frozen weight
(:func:`statistics_of`), nor to take back MKL-DNN's own layout of a weight
(:func:`to_default_layout`), nor to see a block's children, graph and dropout rate (what
tells whether a step draws random numbers: :func:`child_blocks`, :func:`block_graph`,
:func:`hybridized`, :func:`dropout_rate`).
All are needed (the broadcast before the first forward pass, zero-copy gradient buckets that
stay correct whatever the user does to parameters), so the private calls live here, behind a
version check: a different MXNet fails loudly at import instead of training subtly wrong.
"""
from __future__ import annotations

import ctypes
import os
import pickle
import struct
from typing import Callable, List, Optional, Sequence

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.base import NDArrayHandle, _LIB, check_call

SUPPORTED = ("1.9.",)
if not mx.__version__.startswith(SUPPORTED):
    raise ImportError(f"hvdtrain uses Gluon internals of MXNet {', '.join(SUPPORTED)}x; "
                      f"found MXNet {mx.__version__}")


def rehome_gradient(param, device: int, grad: mx.nd.NDArray) -> None:
    """Make `grad` the gradient array of `param` on its `device`-th context.

    Backward writes into whatever array autograd has marked for the parameter's data, so
    `grad` may be a view into a larger buffer; its values are the caller's to set.
    """
    grads = param.list_grad()
    if grads[device].shape != grad.shape or grads[device].dtype != grad.dtype:
        raise ValueError(f"{param.name}: gradient {grad.shape} {grad.dtype} does not match "
                         f"{grads[device].shape} {grads[device].dtype}")
    data = param.list_data()
    # Marking resets autograd's "backward has written this gradient" flags, which the
    # Trainer's stale-gradient check reads: keep them as they were.
    fresh = [array._fresh_grad for array in data]  # pylint: disable=protected-access
    param._grad[device] = grad  # pylint: disable=protected-access
    autograd.mark_variables(data, param.list_grad(), param.grad_req)
    for array, flag in zip(data, fresh):
        array._fresh_grad = flag  # pylint: disable=protected-access


def gradient_lists(params: Sequence) -> list:
    """Each parameter's own list of gradient arrays (None without one), as Gluon holds it.

    Gluon builds a new list whenever it re-creates a parameter's gradients (a changed
    ``grad_req``, ``reset_ctx``, ``cast``, a forced re-initialisation), so comparing these
    lists by identity tells cheaply whether any gradient was re-created."""
    return [param._grad for param in params]  # pylint: disable=protected-access


def bound_gradient_addresses(arrays: Sequence[mx.nd.NDArray]) -> List[Optional[int]]:
    """Where backward will write the gradient of each of `arrays` (parameters' data): the
    start address of the array autograd holds for it (None if it has none).

    This is not always the array the parameter lists: a graph hybridized with
    ``static_alloc=True, static_shape=True`` binds the gradient arrays it first ran backward
    with, and later backward passes hand autograd those arrays back instead of writing the
    ones it was given (``CachedOp::StaticBackward`` in MXNet 1.9). Three C calls per array,
    no copy and no wait (a gradient living in a bucket is a plain view).

    Only for arrays whose memory exists already: ``MXNDArrayGetData`` allocates an array
    created with delayed allocation (``mx.nd.zeros``, whose fill the engine may not have
    run yet) in the calling thread, racing the engine thread that allocates it for the
    fill. The buckets' buffers are therefore allocated when created (``mx.nd.empty``)."""
    get_grad, get_data, free = _LIB.MXNDArrayGetGrad, _LIB.MXNDArrayGetData, _LIB.MXNDArrayFree
    grad, data = NDArrayHandle(), ctypes.c_void_p()
    out, address = ctypes.byref(grad), ctypes.byref(data)
    addresses = []
    for array in arrays:
        check_call(get_grad(array.handle, out))
        if not grad.value:
            addresses.append(None)
            continue
        check_call(get_data(grad, address))
        check_call(free(grad))
        addresses.append(data.value)
    return addresses


def to_default_layout(arrays: Sequence[mx.nd.NDArray]) -> None:
    """Give every one of `arrays` MXNet's default memory layout again, now.

    MKL-DNN keeps a convolution's weight in a layout of its own after an inference pass
    (``MKLDNNDataReorderAsync``). The next forward pass in training mode asks for the
    default layout back from inside the running operator (``Reorder2DefaultAsync``), so
    that reorder is queued on the weight after whatever the Python thread had already
    pushed by then, the optimizer's update included: which of the two writes the weight
    last depends on timing, and two ranks took different updates (docs/reliability.md,
    "Replicas"). ``MXNDArrayGetData`` does the reorder through the engine and waits for it.
    Call it only when nothing is pending on the arrays (after ``mx.nd.waitall()``): it
    asks whether an array is in MKL-DNN's layout in the calling thread. Without MKL-DNN, or
    on a GPU, an array is always in the default layout and nothing happens."""
    address = ctypes.c_void_p()
    for array in arrays:
        check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(address)))


def bound_gradient(param, device: int) -> Optional[mx.nd.NDArray]:
    """The array backward writes the gradient of `param` on its `device`-th context into
    (see :func:`bound_gradient_addresses`)."""
    return param.list_data()[device].grad


def discard_gradients(params: Sequence) -> None:
    """Zero every gradient of `params` in place, wherever backward will write it, and mark
    it as not written by backward, as it stands after an update: an elastic rollback keeps
    nothing of the attempt it undoes.

    In place, because the zero-copy buckets (:mod:`hvdtrain.store.buckets`) hold the
    gradients as views into their flat buffers: new arrays would leave the buckets reducing
    stale ones. The array a static_alloc graph writes instead of the view
    (:func:`bound_gradient`) is zeroed too: under ``grad_req='add'`` it holds micro-batches
    not yet added into the bucket, which the next step would add."""
    for param in params:
        if param.grad_req == "null" or param._grad is None:  # pylint: disable=protected-access
            continue
        for device, (data, grad) in enumerate(zip(param.list_data(), param.list_grad())):
            grad[:] = 0
            bound = bound_gradient(param, device)
            if bound is not None:
                bound[:] = 0  # the same memory as `grad` unless a graph writes elsewhere
            data._fresh_grad = False  # pylint: disable=protected-access


def backward_ran(param, device: int) -> bool:
    """Whether a backward pass wrote `param`'s gradient on its `device`-th context since the
    last update (the flag the Trainer's stale-gradient check reads)."""
    return bool(param.list_data()[device]._fresh_grad)  # pylint: disable=protected-access


def empty_gradients(params: Sequence, device: int) -> None:
    """`params`' gradients on the `device`-th context as a backward pass over no sample
    leaves them: a rank whose whole batch was unusable, or a device a batch smaller than the
    devices left without a part, still takes part in the exchange and the update.

    ``grad_req='write'``: zero in place (the buckets hold the gradients as views), and the
    array a static_alloc graph writes too (:func:`bound_gradient`); ``'add'``: left as it is
    (the step's earlier micro-batches' sum, or the zeros it started from). Either way marked
    written by backward, which the Trainer's stale-gradient check asks. No forward pass runs:
    BatchNorm's running statistics stay as they are, and nothing about the model's inputs
    needs to be known."""
    for param in params:
        if param.grad_req == "null" or param._grad is None:  # pylint: disable=protected-access
            continue
        if param.grad_req == "write":
            param.list_grad()[device][:] = 0
            bound = bound_gradient(param, device)
            if bound is not None:
                bound[:] = 0
        param.list_data()[device]._fresh_grad = True  # pylint: disable=protected-access


def mark_gradients_used(params: Sequence) -> None:
    """Mark every gradient of `params` as not written by backward since, as ``update`` does
    when it applies them: also after an update AMP skipped for an overflow, which leaves the
    marks (a device idle in the next step would otherwise pass for one that ran)."""
    for param in params:
        if param.grad_req == "null":
            continue
        for data in param.list_data():
            data._fresh_grad = False  # pylint: disable=protected-access


def shape_deferred(param) -> bool:
    """Whether `param` waits for a first forward pass to know its shape (Gluon's deferred
    initialisation)."""
    return bool(param._deferred_init)  # pylint: disable=protected-access


def after_deferred_init(param, then) -> None:
    """Call ``then(param)`` right after Gluon initialises `param`, whose shape waits for a
    first forward pass (:func:`shape_deferred`): Gluon has no public hook there."""
    init_impl = param._init_impl  # pylint: disable=protected-access

    def initialised(*args, **kwargs):
        init_impl(*args, **kwargs)
        then(param)

    param._init_impl = initialised  # pylint: disable=protected-access


def trainer_params(trainer) -> list:
    """The parameters `trainer` updates, in its order."""
    return list(trainer._params)  # pylint: disable=protected-access


def trainer_optimizer(trainer):
    """`trainer`'s optimizer object (its learning rate, momentum, update counts)."""
    return trainer._optimizer  # pylint: disable=protected-access


def trainer_compression(trainer):
    """The gradient compression a Trainer was given for MXNet's own stores, or None."""
    return trainer._compression_params  # pylint: disable=protected-access


def asks_update_on_store(trainer) -> bool:
    """Whether `trainer` was made with ``update_on_kvstore=True``."""
    return bool(trainer._kvstore_params.get("update_on_kvstore"))  # pylint: disable=protected-access


def trainer_started(trainer) -> bool:
    """Whether `trainer` has set up its store (it has stepped, or been set up)."""
    return bool(trainer._kv_initialized)  # pylint: disable=protected-access


def set_up_store(trainer, batch_size: int) -> None:
    """Run now what a Trainer's first ``step(batch_size)`` would run before its update:
    gradient scaling, the store's set-up and the parameters' first broadcast.

    The Trainer has no public hook for "set up the store now"."""
    trainer._check_and_rescale_grad(trainer._scale / batch_size)  # pylint: disable=protected-access
    if not trainer._kv_initialized:  # pylint: disable=protected-access
        trainer._init_kvstore()  # pylint: disable=protected-access
    trainer._init_params()  # pylint: disable=protected-access


def gradient_scale(trainer) -> float:
    """What the next update multiplies the summed gradients by, besides ``1 / batch_size``:
    1 normally; under AMP, 1 / the loss scale the backward pass was run with (``amp.scale_loss``
    sets it as the Trainer's private ``_scale``, and ``update`` divides it by the batch size)."""
    return float(trainer._scale)  # pylint: disable=protected-access


def set_loss_scale(trainer) -> None:
    """Under AMP, make `trainer`'s ``_scale`` (what the update divides the summed gradients
    by, besides the sample count) 1 / the loss scale of AMP's scaler, as ``amp.scale_loss``
    sets it in the backward pass; without AMP, nothing.

    Called before every update on every rank: a rank whose whole step was unusable ran no
    backward pass, so ``amp.scale_loss`` never set this step's value there, and it would
    divide the same summed gradient by a stale one (1 after a start or resume, or an older
    loss scale). The scaler's loss scale is the same on every rank (each rank's scaler
    decides overflows from the same reduced gradients), so this is too."""
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    if scaler is not None:
        trainer._scale = trainer._amp_original_scale / scaler.loss_scale  # pylint: disable=protected-access


def amp_scaler(trainer):
    """`trainer`'s AMP loss scaler (``amp.init_trainer`` sets it), or None."""
    return getattr(trainer, "_amp_loss_scaler", None)


class _Decided:
    """A stand-in parameter for a loss scaler's ``has_overflow``: its one gradient is
    finite or not, as a decision taken elsewhere says."""

    def __init__(self, overflowed: bool):
        self._grad = [mx.nd.array([float("inf") if overflowed else 0.0])]


def amp_skips_update(trainer, overflowed: bool) -> bool:
    """Whether `trainer`'s AMP loss scaler skips this update, `overflowed` being whether any
    gradient element of any rank is not finite (decided over the ranks, the same on every
    one). MXNet 1.9.1's ``Trainer._update`` asks ``has_overflow(params)``, which reads every
    parameter's gradient; a sharded trainer (:mod:`.sharded`) holds slices only, so the
    scaler's own ``has_overflow`` (its loss-scale bookkeeping: halve after an overflow,
    double after 2000 clean updates; or a user's subclass) is given one stand-in parameter
    that overflowed or did not."""
    return bool(amp_scaler(trainer).has_overflow([_Decided(overflowed)]))


def set_step_divisor(trainer, samples: float) -> None:
    """Set `trainer`'s ``rescale_grad`` for a step over `samples` samples, as ``step(samples)``
    does before it exchanges; ``allreduce_grads()`` alone leaves the last update's there.
    (PowerSGD's exchange reads it: the units its errors are kept in.)"""
    trainer._check_and_rescale_grad(gradient_scale(trainer) / samples)  # pylint: disable=protected-access


def updates_on_store(trainer) -> bool:
    """Whether `trainer` runs its optimizer in its store (``update_on_kvstore``)."""
    return bool(getattr(trainer, "_update_on_kvstore", False))  # pylint: disable=protected-access


def store_of(trainer):
    """The store `trainer` was given (a KVStore, its name, or None) and its contexts."""
    return (trainer._kvstore_params.get("kvstore"),  # pylint: disable=protected-access
            trainer._contexts)  # pylint: disable=protected-access


def sparse_gradient(param) -> bool:
    """Whether backward writes `param`'s gradient as a row-sparse array
    (``Embedding(sparse_grad=True)``, ``grad_stype='row_sparse'``)."""
    return param._grad_stype != "default"  # pylint: disable=protected-access


def statistics_of(net) -> set:
    """The ids of `net`'s parameters no gradient can ever reach, which each replica moves
    on its own (BatchNorm's running statistics; a gamma or beta it does not learn): Gluon's
    ``differentiable=False``, kept private, and the auxiliary states of every ``SymbolBlock`` inside it
    (BatchNorm's moving mean and variance brought in as a symbol, as GluonCV's SSD
    ``FeatureExpander`` does), which Gluon creates ``grad_req='null'`` but differentiable:
    no gradient reaches them, and the forward pass in training moves them. A parameter
    merely frozen (``grad_req='null'``, not an auxiliary state) is not one."""
    found = {id(p) for p in net.collect_params().values()
             if not p._differentiable}  # pylint: disable=protected-access
    stack, seen = [net], set()
    while stack:
        block = stack.pop()
        if id(block) in seen:
            continue
        seen.add(id(block))
        graph = getattr(block, "_cached_graph", None)
        if isinstance(block, mx.gluon.SymbolBlock) and graph:
            aux = set(graph[1].list_auxiliary_states())
            found.update(id(p) for p in block._params.values()  # pylint: disable=protected-access
                         if p.name in aux)
        stack.extend(block._children.values())  # pylint: disable=protected-access
    return found


def params_by_place(net) -> dict:
    """Every array of `net` by its place in the net ("0.weight", "1.running_mean"), as
    ``save_parameters`` names them: the same in every process, whatever name prefixes the
    process happened to hand out."""
    return net._collect_params_with_prefix()  # pylint: disable=protected-access


def host_arrays(net) -> dict:
    """Every array of `net` copied to the CPU, by its place in the net: what
    ``save_parameters`` writes (MXNet 1.9.1 ``Parameter._reduce``: a lone copy as it is,
    several device copies averaged). The copies are computed when this returns."""
    arrays = {name: param._reduce()  # pylint: disable=protected-access
              for name, param in params_by_place(net).items()}
    for array in arrays.values():
        array.wait_to_read()
    return arrays


def optimizer_states(trainer, alone: bool = False) -> bytes:
    """``Trainer.save_states`` into memory: the optimizer's per-parameter states and the
    optimizer object itself (update counts, the learning-rate scheduler). A sharded trainer
    gathers its whole state: a collective, unless known since its last gather or load
    (`alone`: called by one rank only, which must not gather; :mod:`.sharded`)."""
    if hasattr(trainer, "whole_states_later"):
        return trainer.whole_states_later(alone=alone)()
    updater = trainer._updaters[0]  # pylint: disable=protected-access
    in_index_order(updater.states)
    in_index_order(updater.optimizer)
    return updater.get_states(dump_optimizer=True)


def in_index_order(holder) -> None:
    """Reorder, in place, by parameter index: `holder` an updater's states (a dict), or an
    optimizer's update counts (one dict per device). pickle keeps a dict's insertion order,
    and a rank inserts in the order it updates (a sharded rank its own pieces first), so
    the same values would save as other bytes on each rank; sorted, every rank's are the
    same. The order means nothing to MXNet: counts and states are read by index."""
    counts = getattr(holder, "_all_index_update_counts", None)
    for table in [holder] if counts is None else counts.values():
        ordered = sorted(table.items(), key=lambda item: (type(item[0]).__name__, item[0]))
        table.clear()
        table.update(ordered)


def updater_states(trainer) -> List[dict]:
    """`trainer`'s optimizer state on each of its devices: for each, a dict from a
    parameter's position in the trainer to its state (an NDArray, None, or tuples of them;
    absent before the parameter's first update)."""
    return [updater.states for updater in trainer._updaters]  # pylint: disable=protected-access


class StatesLater:
    """:func:`optimizer_states` as they were when this was made, serialised when called.

    Attributes
    ----------
    states : dict
        The per-parameter states (NDArrays, or tuples of them), copied to host memory.
    """

    def __init__(self, states: dict, frozen_optimizer: bytes):
        self.states = states
        self._frozen = frozen_optimizer

    def __call__(self) -> bytes:
        return pickle.dumps((self.states, pickle.loads(self._frozen)))


def optimizer_states_later(trainer) -> StatesLater:
    """:func:`optimizer_states` as they are now, serialised later (by a background write):
    the per-parameter states are copied to host memory now (a memory copy, done when this
    returns) and the optimizer object pickled now (small: its update counts and scheduler),
    so that training may go on changing both. Calling the result gives the bytes
    :func:`optimizer_states` gives now (MXNet 1.9.1 ``Updater.get_states``)."""
    updater = trainer._updaters[0]  # pylint: disable=protected-access
    return states_later(updater.states, updater.optimizer)


def states_later(states: dict, optimizer, copy: bool = True) -> StatesLater:
    """:func:`optimizer_states_later` of per-parameter `states` (an updater's, or a sharded
    trainer's gathered whole) and their `optimizer`; `copy` False: `states` are arrays of
    their own on the CPU already, which training does not change (kept, not copied)."""
    frozen = frozen_optimizer(optimizer)
    copied = {index: _copied(state) for index, state in states.items()} if copy \
        else dict(states)
    in_index_order(copied)
    _copied(list(copied.values()), wait=True)
    return StatesLater(copied, frozen)


def frozen_optimizer(optimizer) -> bytes:
    """`optimizer` pickled as ``Updater.get_states`` saves it: without its parameters, its
    update counts in parameter-index order (the same bytes on every rank)."""
    in_index_order(optimizer)
    param_dict, optimizer.param_dict = optimizer.param_dict, {}  # as get_states leaves it out
    try:
        return pickle.dumps(optimizer)
    finally:
        optimizer.param_dict = param_dict


def _copied(state, wait: bool = False):
    """`state` (an NDArray, None, or tuples and lists of them) with each array copied to
    host memory (or, with `wait`, waited for). To the CPU, not ``copy()``, which keeps the
    array's context: on a GPU the copy would take device memory, beside training's, for as
    long as the write runs (loading the states moves each to its weight's device again:
    ``Updater.sync_state_context``)."""
    if isinstance(state, mx.nd.NDArray):
        if wait:
            state.wait_to_read()
            return state
        return state.copyto(mx.cpu())
    if isinstance(state, (tuple, list)):
        return type(state)(_copied(part, wait) for part in state)
    return state


def set_optimizer_states(trainer, blob: bytes) -> None:
    """``Trainer.load_states`` from memory (MXNet 1.9.1 gluon/trainer.py), without its
    store initialisation: that is a collective, and an elastic restore runs on survivors
    alone. A sharded trainer cuts its slices out of them (:mod:`.sharded`)."""
    # pylint: disable=protected-access
    if hasattr(trainer, "set_whole_states"):
        trainer.set_whole_states(blob)
        return
    for updater in trainer._updaters:
        updater.set_states(blob)
        updater.optimizer = trainer._updaters[0].optimizer
    trainer._optimizer = trainer._updaters[0].optimizer
    trainer._optimizer.param_dict = {i: p for i, p in enumerate(trainer._params)}


def skip_first_step_broadcast(trainer) -> None:
    """Tell a trainer with a store that its parameters are already the same everywhere.

    ``gluon.Trainer`` broadcasts every parameter through its store on its first step
    (``_init_params``). A worker joining a running elastic job would make that broadcast
    alone while the others, past their first step, reduce gradients, and hang. A sync has
    just written rank 0's values everywhere, so the broadcast is owed no more."""
    # pylint: disable=protected-access
    if not trainer._kv_initialized:
        trainer._init_kvstore()  # creates the store's bindings; no collective
    trainer._params_to_init = [p for p in trainer._params_to_init if p._deferred_init]


def set_up_store_early(trainer) -> bool:
    """Set `trainer`'s store up now, as its first step would before its broadcast (no
    collective is made): a BucketedTrainer plans its buckets, so that a static graph that
    runs backward from here on writes into them. Returns False, leaving it to the first
    step, while a parameter has no data yet (deferred initialisation)."""
    # pylint: disable=protected-access
    if trainer._kv_initialized:
        return True
    if any(param._data is None for param in trainer._params):
        return False
    trainer._init_kvstore()
    return True


def broadcast_at_first_step(trainer, keep) -> None:
    """Let `trainer`'s first step broadcast only the parameters ``keep(param)`` accepts
    (``gluon.Trainer`` broadcasts every parameter through its store then): for arrays made
    equal across ranks otherwise, such as running statistics averaged at that step."""
    trainer._params_to_init = [p for p in trainer._params_to_init  # pylint: disable=protected-access
                               if keep(p)]


def model_store_url(file_name: str) -> str:
    """Where MXNet's model store downloads the zoo's `file_name` (``resnet18_v1-a0666292``)
    from: ``$MXNET_GLUON_REPO`` or Apache's host, as ``get_model_file`` builds it."""
    from mxnet.gluon.model_zoo import model_store  # pylint: disable=import-outside-toplevel
    repo = os.environ.get("MXNET_GLUON_REPO", model_store.apache_repo_url)
    return model_store._url_format.format(  # pylint: disable=protected-access
        repo_url=repo if repo.endswith("/") else repo + "/", file_name=file_name)


def child_blocks(block) -> list:
    """The blocks `block` registered as its children (Gluon keeps them privately)."""
    return list(getattr(block, "_children", {}).values())


def block_graph(block):
    """The symbol a SymbolBlock or a hybridized HybridBlock runs (a hybridized one has it
    once its first forward pass built it), or None."""
    graph = getattr(block, "_cached_graph", None)
    hybrid = isinstance(block, mx.gluon.SymbolBlock) or hybridized(block)
    return graph[1] if hybrid and graph else None


def hybridized(block) -> bool:
    """Whether `block` is a HybridBlock that ``hybridize()`` made run as a graph."""
    return isinstance(block, mx.gluon.HybridBlock) and bool(getattr(block, "_active", False))


def dropout_rate(block) -> float:
    """The rate of a Gluon ``Dropout``, ``DropoutCell`` or RNN layer (its ``dropout``)."""
    for name in ("_rate", "_dropout"):
        if hasattr(block, name):
            return float(getattr(block, name))
    return 1.0  # not found: taken to draw


def raw_array_header(shape: Sequence[int], dtype) -> bytes:
    """What precedes a dense CPU array's data in the bytes MXNet 1.9.1 pickles it as
    (``NDArray.__getstate__``: ``MXNDArraySaveRawBytes``): magic, storage type, the number
    of dimensions, each as an int64, the context and the dtype's flag. Taken from a
    one-element array of as many dimensions, its dimensions then written in (the data of
    `shape` itself is never allocated)."""
    dims = len(shape)
    probe = mx.nd.zeros((1,) * dims, ctx=mx.cpu(), dtype=dtype)
    raw = bytes(probe.__getstate__()["handle"])
    head = bytearray(raw[:len(raw) - np.dtype(dtype).itemsize])
    head[12:12 + 8 * dims] = struct.pack(f"<{dims}q", *shape)
    return bytes(head)
