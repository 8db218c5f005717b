"""PowerSGD's factors: which gradients are compressed, the buffers of a bucket of them,
and the orthogonalisation between the two allreduces (:mod:`.powersgd` runs the steps)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

MIN_COMPRESSION_RATE = 2  # DDP's: only gradients that shrink at least this much


def matrix_shape(shape: Sequence[int]) -> Tuple[int, int]:
    """The matrix a gradient of `shape` is read as: (first axis, all others flattened)."""
    return int(shape[0]), int(np.prod(shape[1:]))


def factor_rank(shape: Sequence[int], rank: int) -> int:
    """The rank of the factors of a gradient of `shape`: `rank`, or less for a thin one."""
    return min(rank, *matrix_shape(shape))


def compresses(shape: Sequence[int], rank: int) -> bool:
    """Whether a gradient of `shape` travels as rank-`rank` factors (DDP's rule: 2-D or
    more, and (n + m) r at least MIN_COMPRESSION_RATE times smaller than n m)."""
    if len(shape) < 2:
        return False
    rows, cols = matrix_shape(shape)
    return (rows + cols) * factor_rank(shape, rank) * MIN_COMPRESSION_RATE < rows * cols


def orthogonalise(p: mx.nd.NDArray, out: mx.nd.NDArray) -> None:
    """Write to `out` the orthonormal columns Gram-Schmidt makes of `p` (n x r, r <= n).

    Householder QR (LAPACK's ``gelqf`` of p^T = L Q) with each column's sign set so that
    R's diagonal is >= 0, as Gram-Schmidt's is: the same columns, stabler, one operator per
    matrix, and a zero column (a gradient of zeros) gives a unit vector, not NaNs."""
    rows, lower = mx.nd.linalg.gelqf(p.T)
    signs = (mx.nd.diag(lower) >= 0) * 2 - 1
    mx.nd.transpose(mx.nd.broadcast_mul(rows, signs.reshape((-1, 1))), out=out)


@dataclass
class Matrix:
    """One compressed gradient: views of its bucket's buffers."""

    position: int  # in the Trainer's parameter list
    shape: Tuple[int, ...]  # the parameter's own
    grad: mx.nd.NDArray  # n x m, the gradient buffer
    p: mx.nd.NDArray  # n x r
    q: mx.nd.NDArray  # m x r
    error: mx.nd.NDArray  # n x m, this rank's error (at its bucket's ``error_scale``)


class FactoredBucket:
    """The factors and errors of one bucket of compressed gradients (`flat`, one device)."""

    def __init__(self, flat: mx.nd.NDArray, grads: List[Tuple[int, mx.nd.NDArray]],
                 rank: int):
        ctx = flat.context
        sizes = [(matrix_shape(g.shape), factor_rank(g.shape, rank)) for _, g in grads]
        self.flat = flat
        self.p_flat = mx.nd.zeros(sum(n * r for (n, _), r in sizes), ctx=ctx)
        self.q_flat = mx.nd.zeros(sum(m * r for (_, m), r in sizes), ctx=ctx)
        self.error_flat = mx.nd.zeros(flat.shape, ctx=ctx)
        # The error is kept in gradient units at this step's rescale_grad: when the next
        # step's differs (another count, another loss scale) it is rescaled first.
        self.error_scale = 1.0
        self.q_kept: Optional[mx.nd.NDArray] = None  # Q before a guarded step
        self.matrices: List[Matrix] = []
        at, at_p, at_q = 0, 0, 0
        for (position, grad), ((n, m), r) in zip(grads, sizes):
            self.matrices.append(Matrix(
                position, tuple(grad.shape), flat[at:at + n * m].reshape((n, m)),
                self.p_flat[at_p:at_p + n * r].reshape((n, r)),
                self.q_flat[at_q:at_q + m * r].reshape((m, r)),
                self.error_flat[at:at + n * m].reshape((n, m))))
            at, at_p, at_q = at + n * m, at_p + n * r, at_q + m * r
