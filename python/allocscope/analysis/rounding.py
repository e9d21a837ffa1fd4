"""The CUDA caching allocator's request rounding (round_size), vectorized.

../shared/torch_internals.md §3: requests under 512 B take 512 B; others are
rounded up to a multiple of 512 B, or, where `roundup_power2_divisions` gives
d > 1 divisions for the request's power-of-two bucket, to the next of d equal
steps between two powers of two. A block can still end up larger than this
(a free block too small to split is handed out whole); the capture does not
say when, so that surplus stays in the cached-free figure.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

MIN_BLOCK = 512
_BUCKETS = 16  # 1 MiB, 2 MiB, ..., 64 GiB and above


def round_size(sizes: np.ndarray, divisions: Sequence[int] = ()) -> np.ndarray:
    """Block sizes the allocator rounds requests of `sizes` bytes up to.

    divisions: the allocator's roundup_power2_divisions table (16 entries, one
    per power-of-two bucket from 1 MiB; 0 or 1 means plain 512 B rounding)."""
    s = np.asarray(sizes, dtype=np.int64)
    out = np.maximum(MIN_BLOCK, (s + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK)
    table = np.zeros(_BUCKETS, np.int64)
    table[:min(len(divisions), _BUCKETS)] = list(divisions)[:_BUCKETS]
    if not (table > 1).any():
        return out
    positive = np.maximum(s, 1)
    log2 = np.floor(np.log2(positive.astype(np.float64))).astype(np.int64)
    # float log2 can be off by one next to a power of two: correct it exactly
    log2 -= (np.left_shift(np.int64(1), log2) > positive).astype(np.int64)
    log2 += (np.left_shift(np.int64(1), log2 + 1) <= positive).astype(np.int64)
    d = table[np.clip(log2 - 20, 0, _BUCKETS - 1)]
    use = (d > 1) & (s > MIN_BLOCK * d) & (s >= MIN_BLOCK)
    if not use.any():
        return out
    floor2 = np.left_shift(np.int64(1), log2[use])
    d_log2 = np.floor(np.log2(d[use].astype(np.float64))).astype(np.int64)
    step = np.right_shift(floor2, d_log2)
    su = s[use]
    rounded = np.where(step == 0, floor2 * 2, (su + np.maximum(step, 1) - 1) // np.maximum(step, 1) * np.maximum(step, 1))
    rounded = np.where(su == floor2, su, rounded)  # powers of two stay as they are
    out[use] = rounded
    return out
