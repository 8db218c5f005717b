"""PowerSGD in NumPy, written from the paper, as the independent side of hvdtrain's tests.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019: Algorithm 1 (rank-r compression) inside Algorithm 2
(error feedback), for W simulated workers in one process, in float64. Each worker w holds
g_w, its gradient averaged over its own batch, and the update is the average over workers.
Nothing here comes from hvdtrain: not its units (it sums and rescales), not its
orthogonalisation (LAPACK's Householder QR), not its warm start.

Algorithm 1, for one matrix and the previous Q (m x r, first drawn i.i.d. standard normal):

    P  <- M Q ; P <- ALL-REDUCE MEAN(P)
    P^ <- ORTHOGONALIZE(P)               (Gram-Schmidt)
    Q  <- M^T P^ ; Q <- ALL-REDUCE MEAN(Q)
    decompress: P^ Q^T

Algorithm 2, per worker: Delta_w = g_w + e_w; e_w <- Delta_w - decompress(...); the update
is the decompressed average. Vector-shaped parameters are aggregated uncompressed (footnote
of Algorithm 1), as are those the caller names uncompressed.
"""
import numpy as np


def gram_schmidt(p):
    """Orthonormal columns of `p`, column by column (classical Gram-Schmidt, twice for
    float64 accuracy: 'twice is enough')."""
    p = np.array(p, dtype=np.float64)
    for _ in range(2):
        for i in range(p.shape[1]):
            for j in range(i):
                p[:, i] -= (p[:, j] @ p[:, i]) * p[:, j]
            p[:, i] /= np.linalg.norm(p[:, i])
    return p


class ReferencePowerSGD:
    """W workers running Algorithms 1 and 2 on the gradients they are given.

    Parameters
    ----------
    compressed : dict
        name -> the first Q (m x r) of each compressed parameter.
    workers : int
    error_feedback : bool
    """

    def __init__(self, compressed, workers, error_feedback=True):
        self.q = {name: np.array(q, dtype=np.float64) for name, q in compressed.items()}
        self.workers = workers
        self.error_feedback = error_feedback
        self.errors = [dict() for _ in range(workers)]
        self.p = {}

    def step(self, grads, compress=True):
        """One step; `grads[w][name]` is worker w's averaged gradient. Returns the update
        (name -> the averaged, decompressed gradient). With `compress` False every
        parameter is averaged whole (a warm-up step), errors and Q untouched."""
        names = grads[0].keys()
        update = {}
        for name in names:
            if not compress or name not in self.q:
                update[name] = np.mean([g[name] for g in grads], axis=0)
                continue
            shape = grads[0][name].shape
            deltas = []
            for w in range(self.workers):
                delta = np.asarray(grads[w][name], dtype=np.float64).reshape(shape[0], -1)
                if self.error_feedback and name in self.errors[w]:
                    delta = delta + self.errors[w][name]
                deltas.append(delta)
            p = np.mean([d @ self.q[name] for d in deltas], axis=0)
            p_hat = gram_schmidt(p)
            q = np.mean([d.T @ p_hat for d in deltas], axis=0)
            approx = p_hat @ q.T
            for w in range(self.workers):
                self.errors[w][name] = deltas[w] - approx
            self.p[name], self.q[name] = p_hat, q
            update[name] = approx.reshape(shape)
        return update
