"""LAMB on slices of parameters (:mod:`.sharded`): its trust ratio needs each parameter's
whole norms, which are sums of the ranks' partial ones.

MXNet 1.9.1's LAMB takes, for each parameter, ``g = lamb_update_phase1(w, grad, mean, var)``
(Adam's direction plus decay, elementwise), then ``w -= lr * (||w|| / ||g||) * g``
(``lamb_update_phase2``, with the optional bounds on ``||w||``). On slices, phase 1 runs per
piece; each rank's squared norms of its pieces' ``w`` and ``g`` are put at their parameter's
place in one vector, summed over the ranks by one exact collective, and phase 2 takes each
parameter's whole norms from it.
"""
from __future__ import annotations

from typing import Callable, Sequence

import mxnet as mx
import numpy as np

from ..config import ConfigError


def lamb_update(optimizer, states: dict, indices: Sequence[int], grads, weights,
                num_params: int, sum_over_ranks: Callable[[mx.nd.NDArray], None],
                ctx: mx.Context) -> None:
    """One LAMB step of the pieces (`indices`: each piece's parameter position, its
    gradient and weight views), their state kept in `states` (an updater's, by position).
    `sum_over_ranks` sums a vector over the ranks in place; every rank calls it, with or
    without pieces; `ctx` is where the rank's weights are."""
    if any(w.dtype != np.float32 for w in weights):
        raise ConfigError("shard_optimizer with LAMB updates float32 weights only: train in "
                          "float32, or drop shard_optimizer")
    phase1 = {"beta1": optimizer.beta1, "beta2": optimizer.beta2,
              "epsilon": optimizer.epsilon, "bias_correction": optimizer.bias_correction,
              "rescale_grad": optimizer.rescale_grad}
    if optimizer.clip_gradient:
        phase1["clip_gradient"] = optimizer.clip_gradient
    phase2 = {key: value for key, value in (("lower_bound", optimizer.lower_bound),
                                            ("upper_bound", optimizer.upper_bound)) if value}
    directions, parts, rates = [], [], []
    for index, grad, weight in zip(indices, grads, weights):
        if index not in states:
            states[index] = optimizer.create_state(index, weight)
        optimizer._update_count(index)  # pylint: disable=protected-access
        rates.append(optimizer._get_lr(index))  # pylint: disable=protected-access
        mean, var = states[index]
        direction = mx.nd.lamb_update_phase1(
            weight, grad, mean, var, wd=optimizer._get_wd(index),  # pylint: disable=protected-access
            t=optimizer._index_update_count[index], **phase1)  # pylint: disable=protected-access
        directions.append(direction)
        parts.append((mx.nd.sum(mx.nd.square(weight)),
                      mx.nd.sum(mx.nd.square(direction))))
    # Each parameter's squared norms of w and g at 2i and 2i + 1, this rank's pieces' parts.
    squares = mx.nd.zeros(2 * num_params, ctx=ctx, dtype=np.float32)
    for index, (weight_part, direction_part) in zip(indices, parts):
        squares[2 * index:2 * index + 1] = weight_part
        squares[2 * index + 1:2 * index + 2] = direction_part
    sum_over_ranks(squares)
    norms = mx.nd.sqrt(squares)
    for index, weight, direction, rate in zip(indices, weights, directions, rates):
        mx.nd.lamb_update_phase2(weight, direction, norms[2 * index:2 * index + 1],
                                 norms[2 * index + 1:2 * index + 2], lr=rate, out=weight,
                                 **phase2)
