"""PowerSGD gradient compression with error feedback, inside the gradient buckets.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019), Algorithms 1 and 2; where the paper leaves a choice
open, PyTorch DDP's ``powerSGD_hook`` decides. A gradient matrix M (n x m: a 2-D weight, or a
convolution's (out, in, k, k) read as (out, in*k*k)) that rank-r factors shrink at least
2 times (DDP's ``min_compression_rate``) travels as P (n x r) and Q (m x r), two allreduces per
bucket; every other gradient (biases, BatchNorm) goes whole in buckets of its own::

    M        = gradient + error            this rank's; the error of the step before
    P        = sum over ranks of M Q        allreduce 1 (Q: the last step's, kept warm)
    P        = orthonormal columns of P     as Gram-Schmidt makes them
    Q        = sum over ranks of M^T P      allreduce 2
    error    = M - P Q^T / workers          this rank's share of what the factors left out
    gradient = P Q^T                        the same on every rank

**Units.** hvdtrain's stores sum gradients, and ``Trainer.step(count)`` divides the sum by
the step's global sample count afterwards (``rescale_grad``, which under AMP also holds 1 /
loss scale). Here M is scaled by ``rescale_grad`` on the way in and the result unscaled on
the way out, so P, Q and the error are in the units of the update: the paper's and DDP's
numbers (their ranks average gradients already averaged over each rank's batch), float16's
range on the wire whatever the batch or loss scale, and an error carried into a step of
another count (an epoch's short last batch) still means what it meant. The optimizer then
divides the approximation by the same count as any other gradient, on every rank alike.

Only the sum of the ranks' errors ever reaches an update (P, Q and the new errors' sum are
all made from sums over ranks), so that sum is what a checkpoint keeps: one model's worth of
numbers whatever the world size, split evenly over the ranks of the run that resumes.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from .powersgd_factors import FactoredBucket, compresses, orthogonalise

logger = logging.getLogger("hvdtrain")


class PowerSGD:
    """Rank-`rank` PowerSGD state and exchange for a :class:`~.buckets.BucketedTrainer`.

    Parameters
    ----------
    rank : int
        Columns of P and Q (``--powersgd-rank``).
    start_step : int
        Steps exchanged whole first (DDP's ``start_powerSGD_iter``), counted over the run.
    error_feedback : bool
        Carry each rank's error into its next step (the paper's Algorithm 2); off only to
        study what it is worth.
    seed : int
        Seeds the first Q of every matrix, the same on every rank.
    guard : bool
        Read after each step whether the factors are finite (AMP: a loss-scale overflow
        makes them NaN on every rank, and AMP skips that update); if not, Q goes back to
        the step before and the errors to zero, instead of poisoning every later step.
    """

    def __init__(self, rank: int = 4, start_step: int = 1000, error_feedback: bool = True,
                 seed: int = 0, guard: bool = False):
        self.rank, self.start_step, self.error_feedback = rank, start_step, error_feedback
        self.seed, self.guard = seed, guard
        self.steps = 0  # optimizer steps of the run so far (those no rank had a sample for too)
        self._buckets: List[FactoredBucket] = []
        self._store, self._workers = None, 1  # set by the plan
        self._compressing = False  # whether the step under way is compressed
        self._carried_q: Dict[int, mx.nd.NDArray] = {}  # by position, for the next plan
        self._carried_error: Dict[int, mx.nd.NDArray] = {}  # this rank's, update units
        self._error_sums: Dict[int, mx.nd.NDArray] = {}  # all ranks', from a checkpoint

    def compresses(self, shape: Sequence[int]) -> bool:
        """Whether a gradient of `shape` is compressed."""
        return compresses(shape, self.rank)

    def plan(self, buckets: Sequence[Optional[Tuple[mx.nd.NDArray, list]]],
             store) -> List[Optional[FactoredBucket]]:
        """Set up the factors of the trainer's buckets: each entry (flat, [(position,
        gradient view), ...]) for a compressed bucket, None for one exchanged whole; their
        factors go through `store` (Horovod's). What the last plan held (warm Q, errors) is
        carried over by parameter position."""
        for bucket in self._buckets:
            for matrix in bucket.matrices:
                self._carried_q.setdefault(matrix.position, matrix.q.copy())
                self._carried_error.setdefault(matrix.position,
                                               matrix.error * bucket.error_scale)
        self._store, self._workers = store, store.num_workers
        self._split_error_sums()
        made = [None if entry is None else FactoredBucket(entry[0], entry[1], self.rank)
                for entry in buckets]
        self._buckets = [bucket for bucket in made if bucket is not None]
        for bucket in self._buckets:
            self._fill(bucket)
        return made

    def _fill(self, bucket: FactoredBucket) -> None:
        """Q and errors of `bucket` from what was carried or loaded, else a fresh start."""
        for matrix in bucket.matrices:
            q = self._carried_q.pop(matrix.position, None)
            if q is None or q.shape != matrix.q.shape:  # none yet, or another rank
                q = mx.nd.array(np.random.RandomState([self.seed, matrix.position])
                                .standard_normal(matrix.q.shape))
            q.copyto(matrix.q)
            error = self._carried_error.pop(matrix.position, None)
            matrix.error[:] = 0 if error is None else error.reshape(matrix.error.shape)
        bucket.error_scale = 1.0  # carried errors are in update units

    def exchange(self, bucket: FactoredBucket, key: str, scale: float,
                 priority: int = 0) -> None:
        """Reduce `bucket`'s gradients: whole during the warm start (and alone), else as
        factors. `scale` is the Trainer's ``rescale_grad`` for this step.

        Passes over the compressed gradients (n m numbers each), the fewest MXNet's
        operators allow: M is formed in the error's own buffer (E += G: read both, write
        one), read by the two products (M Q, M^T P), the gradient written once as P Q^T,
        and the new error made in place from M (E -= P Q^T / workers: BLAS reads and writes
        it, no copy): eight in all, against ten when M was formed in the gradient's buffer
        and the error copied out of it. The products' arithmetic is rank r per number."""
        store = self._store
        if not self._compressing:
            store.pushpull(key, bucket.flat, priority=priority)
            return
        if self.error_feedback:
            if bucket.error_scale != scale:  # the last step's units: another count or scale
                bucket.error_flat *= bucket.error_scale / scale
                bucket.error_scale = scale
            bucket.error_flat += bucket.flat  # M, in the error's buffer
            compressed = [(m, m.error) for m in bucket.matrices]
        else:
            compressed = [(m, m.grad) for m in bucket.matrices]
        if self.guard:
            bucket.q_kept = bucket.q_flat.copy()
        linalg = mx.nd.linalg
        for m, whole in compressed:
            # M Q, as a fully connected layer of weights Q^T (n rows of M, r outputs): with
            # MKL-DNN this thin product runs about twice as fast as BLAS's gemm. The weights
            # are a fresh copy (r x m numbers): MKL-DNN may keep weights in a layout of its
            # own, which Q's buffer, read by the collective, must not take.
            mx.nd.FullyConnected(whole, mx.nd.transpose(m.q) * scale, num_hidden=m.q.shape[1],
                                 no_bias=True, out=m.p)
        store.pushpull(f"{key}.p", bucket.p_flat, priority=priority)
        for m, whole in compressed:
            orthogonalise(m.p, m.p)
            linalg.gemm2(whole, m.p, transpose_a=True, alpha=scale, out=m.q)
        store.pushpull(f"{key}.q", bucket.q_flat, priority=priority)
        for m, _ in compressed:
            # P Q^T / scale into the gradient, the same fully connected form (rows of P).
            mx.nd.FullyConnected(m.p * (1.0 / scale), m.q.copy(), num_hidden=m.grad.shape[1],
                                 no_bias=True, out=m.grad)
            if self.error_feedback:  # M - P Q^T / workers, in place (out is C: no copy)
                linalg.gemm(m.p, m.q, m.error, transpose_b=True, beta=1.0,
                            alpha=-1.0 / (scale * self._workers), out=m.error)

    def start_step_exchange(self) -> None:
        """Called before a step's buckets are exchanged: decides whether it compresses."""
        workers = self._workers = self._store.num_workers  # an elastic job's changes
        # Alone nothing travels: the gradient stays exact.
        self._compressing = self.steps >= self.start_step and workers > 1

    def finish_step(self) -> None:
        """Called after a step's buckets are exchanged."""
        if self._compressing and self.guard:
            flats = [a for b in self._buckets for a in (b.p_flat, b.q_flat)]
            if flats and not mx.nd.multi_all_finite(*flats, num_arrays=len(flats)).asscalar():
                for bucket in self._buckets:
                    bucket.q_kept.copyto(bucket.q_flat)
                    bucket.error_flat[:] = 0
                logger.info("PowerSGD: a non-finite gradient (an AMP overflow, whose update "
                            "is skipped): Q kept, errors restarted from zero")
        self.steps += 1

    # --- state: checkpoints and elastic resets -----------------------------------------

    def snapshot(self) -> Dict[str, np.ndarray]:
        """Q of every compressed gradient and the sum of all ranks' errors (update units),
        by parameter position (``q.<i>``, ``error.<i>``). A collective: every rank calls it
        at the same point (the sum is exact, never float16)."""
        arrays = {}
        for index, bucket in enumerate(self._buckets):
            total = bucket.error_flat * bucket.error_scale
            if self._store.num_workers > 1:
                self._store.sum_exact(f"powersgd.errors.{index}", total)
            at = 0
            for matrix in bucket.matrices:
                size = matrix.error.size
                arrays[f"q.{matrix.position}"] = matrix.q.asnumpy()
                arrays[f"error.{matrix.position}"] = \
                    total[at:at + size].reshape(matrix.shape).asnumpy()
                at += size
        return arrays

    def load(self, arrays: Dict[str, np.ndarray], step: int) -> None:
        """Continue from a :meth:`snapshot` (this rank takes 1 / workers of the error sum)
        at optimizer step `step`. A Q of another rank (``--powersgd-rank`` changed) starts
        afresh."""
        self.steps = step
        for name, value in arrays.items():
            kind, position = name.split(".")
            if kind == "q":
                self._carried_q[int(position)] = mx.nd.array(value)
            elif kind == "error":  # split once the world size is known (at the plan)
                self._error_sums[int(position)] = mx.nd.array(value)
        if self._buckets:  # planned already: the store was set up before the resume
            self._split_error_sums()
            for bucket in self._buckets:
                self._fill(bucket)

    def _split_error_sums(self) -> None:
        """This rank's share of every loaded error sum, carried into the next fill."""
        for position, total in self._error_sums.items():
            self._carried_error[position] = total / self._workers
        self._error_sums.clear()

    def reset(self, step: int) -> None:
        """Start again at optimizer step `step`: errors zero, Q from the seed (an elastic
        reset: the lost ranks' errors are gone, and a rank that joins has none)."""
        self.steps = step
        self._carried_q.clear()
        self._carried_error.clear()
        self._error_sums.clear()
        for bucket in self._buckets:
            self._fill(bucket)

    def factors(self, position: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """P, Q and this rank's error (update units) of the parameter at `position`, as
        they stand (for tests and inspection; waits for the device)."""
        for bucket in self._buckets:
            for m in bucket.matrices:
                if m.position == position:
                    return (m.p.asnumpy(), m.q.asnumpy(),
                            (m.error * bucket.error_scale).reshape(m.shape).asnumpy())
        raise KeyError(f"parameter {position} is not compressed")

    def values_sent(self, gradient_values: int) -> int:
        """Numbers a rank sends per compressed step, of a gradient of `gradient_values`:
        the factors in place of the compressed matrices."""
        matrices = sum(m.grad.size for b in self._buckets for m in b.matrices)
        factors = sum(b.p_flat.size + b.q_flat.size for b in self._buckets)
        return gradient_values - matrices + factors

    def describe(self) -> str:
        """What the plan compresses, for the log."""
        matrices = [m for b in self._buckets for m in b.matrices]
        whole = sum(m.grad.size for m in matrices) * 4
        factors = sum(b.p_flat.size + b.q_flat.size for b in self._buckets) * 4
        return (f"PowerSGD rank {self.rank}: {len(matrices)} gradient matrices "
                f"({whole / 2**20:.1f} MiB) travel as factors of {factors / 2**10:.0f} KiB "
                f"from step {self.start_step}"
                f"{'' if self.error_feedback else ', without error feedback'}")
