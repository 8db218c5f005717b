"""What a one-process reference needs to train as N ranks train from a DataLoader on a batch
sampler (docs/data.md, "A DataLoader on a batch sampler"): each epoch's batches as every
rank draws them, and the steps they make, each the batches of all ranks."""
import random

import numpy as np


def drawn(make_sampler, epoch, seed):
    """The epoch's batches: a fresh sampler (`make_sampler()`) iterated with numpy's
    generator seeded by [seed, epoch] and Python's by seed * 2**32 + epoch."""
    np.random.seed([seed, epoch])
    random.seed(seed * 2 ** 32 + epoch)
    return [list(batch) for batch in make_sampler()]


def steps_of(batches, ranks_at, step):
    """The epoch's steps from global step `step` on: each the batches of all ranks (rank r
    takes batches r, r + N, ...), the rest padded to a multiple of the ranks with the
    epoch's first batches. `ranks_at(step)` is the number of ranks at a global step."""
    done = 0
    while done < len(batches):
        ranks = ranks_at(step)
        rest = batches[done:]
        rest += [batches[i % len(batches)] for i in range(-len(rest) % ranks)]
        yield rest[:ranks]
        done, step = done + ranks, step + 1
