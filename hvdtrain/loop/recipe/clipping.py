"""``--clip-grad-norm MAX``: the averaged gradient scaled down to a global L2 norm of MAX.

The norm is that of the gradient the update applies: summed over the devices and ranks by
the store (zero-copy buckets, float16 on the wire or not), summed over ``--accumulate``'s
micro-batches, divided by the step's global sample count and, under AMP, by the loss scale.
So a step is split where Gluon documents it may be: ``trainer.allreduce_grads()``, the norm,
then ``trainer.update(...)`` (with the Trainer's ``rescale_grad`` set to the step's divisor
before the exchange, as ``step`` sets it: PowerSGD's exchange reads it).

Every rank must clip by the same factor, or the replicas drift apart. The reduced gradient is
the same on every rank, but its norm is a float32 sum whose rounding may differ between
builds (another CPU's kernels); so each rank's squared norm is averaged over the ranks by one
exact collective (a single number) and every rank takes that. The factor,
``min(1, MAX / (norm + 1e-6))`` as torchvision's ``clip_grad_norm_``, enters the update as
part of its gradient scaling (``update(samples / factor)``): nothing rewrites the gradients.
Reading the norm on the host waits for the exchange before the update is queued; on a GPU
that costs the launch queue's head start (docs/training.md).

A norm that is not finite (AMP's loss scale overflowed: AMP then skips the update) leaves the
factor at 1 and is counted apart from the epoch's figures.

Under ``--shard-optimizer`` no rank holds the whole reduced gradient: each reduce-scatters
every bucket first and holds its slices; their squares summed over the ranks are the
squared norm (each element is one rank's), and the update applies the slices it holds.
"""
from __future__ import annotations

import math
from typing import List

import mxnet as mx

from ...store.buckets import BucketedTrainer
from ...store.dist import DistContext
from ...store.gluon_internals import gradient_scale, set_step_divisor

EPS = 1e-6  # torchvision's, added to the norm before dividing
CHUNK = 2 ** 20  # values per float32 dot product of the norm
COLLECTIVE_NAME = "grad_norm"


class GradClipper:
    """Clips each optimizer step's averaged gradient to a global L2 norm.

    Parameters
    ----------
    max_norm : float
    net : gluon.Block
        The model: its parameters with a gradient are the ones measured.
    dist : DistContext
    """

    def __init__(self, max_norm: float, net, dist: DistContext):
        self.max_norm = float(max_norm)
        self.params = list(net.collect_params().values())
        self.dist = dist
        self.norms: List[float] = []  # this epoch's finite norms
        self.clipped = 0
        self.not_finite = 0

    @classmethod
    def of(cls, cfg, net, dist: DistContext):
        """The run's clipper (None without ``--clip-grad-norm``)."""
        return None if cfg.clip_grad_norm is None else cls(cfg.clip_grad_norm, net, dist)

    def step(self, trainer, samples: int) -> float:
        """Exchange, measure, clip and update: ``trainer.step(samples)`` with the gradient
        scaled down to ``max_norm`` when its norm is above. Returns the factor applied."""
        # The exchange sees this step's divisor, as in step(samples): PowerSGD keeps its
        # errors in those units, and the last update left its clipped scaling there.
        set_step_divisor(trainer, samples)
        if hasattr(trainer, "scatter_gradients"):
            norm = self.sharded_norm(trainer, samples)
        else:
            trainer.allreduce_grads()
            norm = self.norm(trainer, samples)
        factor = 1.0
        if math.isfinite(norm):
            self.norms.append(norm)
            factor = min(1.0, self.max_norm / (norm + EPS))
            self.clipped += factor < 1.0
        else:
            self.not_finite += 1
        trainer.update(samples / factor)
        return factor

    def norm(self, trainer, samples: int) -> float:
        """The global L2 norm of the gradient the next ``update(samples)`` would apply,
        the same number on every rank."""
        squares = []
        for array in self._gradients(trainer):
            flat = array.reshape((-1,))
            if flat.dtype != "float32":  # a float16 sum of squares would overflow
                flat = flat.astype("float32")
            # A dot product per chunk of at most CHUNK values, each a view: few engine
            # operations (one per parameter, as gluon.utils.clip_global_norm, is 125 for
            # ResNet-18: 14-52 ms on a busy CPU thread, against 6-12 ms for one dot over
            # all of it), and float32 sums short enough to keep their digits (one dot over
            # 11 million values was 3e-4 off).
            squares += [mx.nd.dot(flat[i:i + CHUNK], flat[i:i + CHUNK]).as_in_context(mx.cpu())
                        for i in range(0, flat.size, CHUNK)]
        total = mx.nd.add_n(*squares) if len(squares) > 1 else squares[0]
        workers = 1
        if self.dist.num_workers > 1 and self.dist.synchronous:
            total = self.dist.sum_across_workers(COLLECTIVE_NAME, total)
            workers = self.dist.num_workers
        # sqrt keeps inf and nan as they are: the caller tells them apart.
        return math.sqrt(float(total.asscalar()) / workers) * gradient_scale(trainer) / samples

    def sharded_norm(self, trainer, samples: int) -> float:
        """:meth:`norm` under ``--shard-optimizer`` (store/sharded.py): each rank holds a
        slice of the summed gradient, so the squares of the slices are summed over the
        ranks (not averaged); the next ``update`` applies those slices."""
        total = trainer.scatter_gradients()
        if self.dist.num_workers > 1 and self.dist.synchronous:
            total = self.dist.sum_across_workers(COLLECTIVE_NAME, total)
        return math.sqrt(float(total.asscalar())) * gradient_scale(trainer) / samples

    def _gradients(self, trainer) -> List[mx.nd.NDArray]:
        """Arrays holding each gradient of the first device once: the zero-copy buckets'
        flat buffers, or each parameter's gradient."""
        if isinstance(trainer, BucketedTrainer):
            return trainer.gradient_buffers()
        return [p.list_grad()[0] for p in self.params if p.grad_req != "null"]

    def take(self) -> dict:
        """The figures since the last call, for an epoch's metrics record, and a fresh
        start: the mean and largest norm before clipping, the steps clipped, and the steps
        whose norm was not finite."""
        figures = dict(grad_norm_mean=sum(self.norms) / len(self.norms) if self.norms else None,
                       grad_norm_max=max(self.norms) if self.norms else None,
                       clipped_steps=self.clipped, grad_norm_not_finite=self.not_finite)
        self.norms, self.clipped, self.not_finite = [], 0, 0
        return figures
