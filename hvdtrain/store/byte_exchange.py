"""Bytes between the ranks through the store's exact sum (every store has it): beside
:mod:`.agree`, the room of what the ranks exchange to decide alike.

Four bytes travel as one float64 word (exact in a sum with the other ranks' zeros). The
lengths are known alike on every rank before the call (agreed, or sent first), so the
buffer's size is too; the collective is named by its site (store/sites.py) and a key every
rank has alike, never by a size.
"""
from __future__ import annotations

from typing import List

import mxnet as mx
import numpy as np


def gather_bytes(dist, name: str, mine: bytes, lengths: List[int]) -> List[bytes]:
    """Every rank's bytes (`lengths`: each rank's count, the same list on every rank),
    through one sum: each rank puts its own in its own place of a zeroed buffer."""
    words = [-(-n // 4) for n in lengths]
    starts = np.cumsum([0] + words)
    buffer = np.zeros(int(starts[-1]), np.float64)
    rank = dist.rank
    padded = mine + b"\0" * (4 * words[rank] - len(mine))
    buffer[starts[rank]:starts[rank + 1]] = np.frombuffer(padded, "<u4")
    if buffer.size:
        buffer = dist.sum_across_workers(name, mx.nd.array(buffer, dtype="float64")).asnumpy()
    return [buffer[starts[r]:starts[r + 1]].astype("<u4").tobytes()[:lengths[r]]
            for r in range(dist.num_workers)]


def broadcast_bytes(dist, name: str, blob: bytes, size: int) -> bytes:
    """Rank 0's `blob` (`size` bytes, known on every rank) on every rank, through one sum
    (the other ranks send zeros)."""
    if not size:
        return b""
    words = np.zeros(-(-size // 4), np.float64)
    if dist.is_root:
        words[:] = np.frombuffer(blob.ljust(words.size * 4, b"\0"), "<u4")
    summed = dist.sum_across_workers(name, mx.nd.array(words, dtype="float64"))
    return summed.asnumpy().astype("<u4").tobytes()[:size]
