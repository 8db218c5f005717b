"""Make every replica hold the same values in the arrays that each replica moves on its own.

Gluon's Trainer reduces gradients only. BatchNorm's ``running_mean`` and ``running_var`` are
updated by each device's own batches and would drift apart between devices and ranks; then a
sharded evaluation would score several different models, and only rank 0's statistics would
reach the saved files. :func:`average_running_stats` averages them over every device of every
rank in a single collective. Averaging (rather than DDP's broadcast of rank 0's buffers)
brings them closer to the statistics of the global batch.

Which arrays: the parameters Gluon declares non-differentiable (``differentiable=False``:
BatchNorm's running statistics, and a gamma or beta it does not learn), never merely frozen
ones (``grad_req='null'`` set by ``--freeze-epochs`` or by a user): those hold the same values
on every rank already, and averaging a whole frozen backbone would cost an allreduce of it at
every epoch end and save, and change it (in float32, the mean of three equal numbers is not
always that number). The average is taken in float64, where the sum of up to 2**29 equal
float32 values and its division are exact: an array that is the same everywhere comes back
unchanged, bit for bit.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import mxnet as mx
import numpy as np

from ...store.dist import DistContext
from ...store.gluon_internals import statistics_of

COLLECTIVE_NAME = "running_stats"


def running_statistics(net) -> List:
    """The parameters of `net` that each replica moves on its own (non-differentiable, or
    a graph's auxiliary state: :func:`~hvdtrain.store.gluon_internals.statistics_of`), in a
    fixed order (the same on every rank)."""
    params, statistics = net.collect_params(), statistics_of(net)
    return [params[name] for name in sorted(params.keys()) if id(params[name]) in statistics]


def average_running_stats(net, dist: DistContext,
                          extra: Sequence[mx.nd.NDArray] = ()) -> int:
    """Average `net`'s running statistics over this worker's devices and over all ranks,
    and write the average into every copy. Every rank must call it at the same point.

    `extra` are float32 arrays (one copy per rank) averaged over the ranks in the same
    collective, in place: the moving averages of those arrays (``--ema``).

    Floating-point arrays are averaged; any other (integer) array takes rank 0's value.
    All arrays travel in one float64 buffer, summed by one uncompressed collective
    (:meth:`DistContext.sum_across_workers`), so every rank ends with bit-identical values.
    Under ``dist_async`` the workers never meet: only the device copies are averaged.

    Returns
    -------
    int
        Number of arrays averaged (0 when there was nothing to do).
    """
    averages, extra_averages = averaged_running_stats(net, dist, extra)
    for param, value in averages:
        for copy in param.list_data():
            value.copyto(copy)
    for array, value in zip(extra, extra_averages):
        if value is not array:
            value.copyto(array)
    if averages:
        mx.nd.waitall()  # and no later untracked write may overtake these copies
    return len(averages)


def averaged_running_stats(net, dist: DistContext, extra: Sequence[mx.nd.NDArray] = ()
                           ) -> Tuple[List[Tuple[object, mx.nd.NDArray]], List[mx.nd.NDArray]]:
    """(parameter, its average over devices and ranks, on the CPU) for each running statistic
    of `net`, as :func:`average_running_stats` computes them, without writing them back: what
    a checkpoint taken in the middle of an epoch saves while training goes on with each
    rank's own; and the averages of the `extra` arrays over the ranks (the arrays
    themselves when there is nothing to average). Every rank must call it at the same
    point; the first list is empty when there is nothing to average."""
    params = running_statistics(net)
    across_ranks = dist.num_workers > 1 and dist.synchronous
    extra = list(extra)
    if not params or (not across_ranks and len(params[0].list_ctx()) == 1):
        return [], extra
    # Under hybridize(static_alloc=True), MXNet 1.9.1's engine does not know that
    # BatchNorm's backward writes the running statistics: reading them waits for nothing,
    # and sees older values. Only waiting for everything makes them current.
    mx.nd.waitall()
    cpu = mx.cpu()
    parts, averaged = [], []
    for param in params:
        copies = param.list_data()
        local = mx.nd.add_n(*[c.as_in_context(cpu).astype("float64") for c in copies])
        local = local / len(copies)
        is_float = np.issubdtype(np.dtype(param.dtype), np.floating)
        if across_ranks and not is_float:
            local = local * float(dist.rank == 0)  # the sum is then rank 0's value
        averaged.append(is_float)
        parts.append(local.reshape(-1))
    if across_ranks:
        parts += [array.as_in_context(cpu).astype("float64").reshape(-1) for array in extra]
    flat = mx.nd.concat(*parts, dim=0)
    if across_ranks:
        flat = dist.sum_across_workers(COLLECTIVE_NAME, flat)
    out, offset = [], 0
    for param, is_float in zip(params, averaged):
        size = int(np.prod(param.shape))
        value = flat[offset:offset + size].reshape(param.shape)
        offset += size
        if across_ranks and is_float:
            value = value / dist.num_workers
        out.append((param, value.astype(param.dtype)))
    if not across_ranks:
        return out, extra
    extra_out = []
    for array in extra:
        value = flat[offset:offset + array.size].reshape(array.shape) / dist.num_workers
        offset += array.size
        extra_out.append(value.astype(array.dtype).as_in_context(array.context))
    return out, extra_out
