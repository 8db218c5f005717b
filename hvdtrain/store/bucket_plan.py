"""Which gradients share a bucket: the plan :class:`~.buckets.BucketedTrainer` follows."""
from __future__ import annotations

from typing import List, Optional, Sequence


def plan_buckets(sizes: Sequence[int], bucket_bytes: int,
                 kinds: Optional[Sequence] = None) -> List[List[int]]:
    """Group parameter positions into buckets of at most `bucket_bytes`, one kind each.

    Parameters
    ----------
    sizes : sequence of int
        Bytes of each parameter's gradient, in the Trainer's parameter order.
    bucket_bytes : int
        Cap of a bucket; a gradient larger than the cap gets a bucket of its own.
        0 puts every parameter in a bucket of its own.
    kinds : sequence, optional
        Each gradient's kind: its dtype (a bucket becomes one flat buffer), and under
        PowerSGD whether it is compressed (a bucket travels either as factors or whole).
        Each kind fills its own open bucket, so a float16 model whose BatchNorm layers
        stay float32 gets about as many buckets as a float32 one.

    Returns
    -------
    list of list of int
        Positions into `sizes`, each bucket's in decreasing order; buckets ordered by
        their first position, from the last parameter (the first gradient backward
        produces) on.
    """
    buckets: List[List[int]] = []
    open_buckets = {}  # kind -> [positions, bytes]
    for position in reversed(range(len(sizes))):
        size = sizes[position]
        current = open_buckets.setdefault(None if kinds is None else kinds[position], [[], 0])
        if current[0] and current[1] + size > bucket_bytes:
            buckets.append(current[0])
            current[:] = [[], 0]
        current[0].append(position)
        current[1] += size
    buckets.extend(positions for positions, _ in open_buckets.values() if positions)
    return sorted(buckets, key=lambda bucket: -bucket[0])
