"""The caching allocator's sizes: c10's constants and its two size rules,
request rounding (round_size) and the size of a new segment
(allocation_size), as c10/cuda/CUDACachingAllocator.cpp writes them.

round_size: requests under 512 B take 512 B; others are rounded up to a
multiple of 512 B, or, where `roundup_power2_divisions` gives d > 1
divisions for the request's power-of-two bucket (16 buckets from 1 MiB), to
the next of d equal steps between two powers of two. A block can still end
up larger than this (a free block too small to split is handed out whole).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["LARGE_BUFFER", "MIN_BLOCK", "MIN_LARGE_ALLOC", "MiB", "ROUND_LARGE", "ROUNDUP_INTERVALS", "SIZE_MAX",
           "SMALL_BUFFER", "SMALL_SIZE", "allocation_size", "round_size", "round_sizes"]

MiB = 1 << 20
SIZE_MAX = (1 << 64) - 1  # max_split_size when unset
MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of it
SMALL_SIZE = MiB  # kSmallSize: requests up to it go to the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small pool segments
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: below it, large requests get a whole large segment
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: the default large segment
ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments are rounded to it
ROUNDUP_INTERVALS = 16  # roundup_power2_divisions buckets: 1 MiB, 2 MiB, ... 32 GiB and above


def _next_division(size: int, divisions: int) -> int:
    """c10's roundup_power2_next_division."""
    if size <= 4 or divisions <= 1 or size & (size - 1) == 0:
        return size
    floor2 = 1 << (size.bit_length() - 1)
    step = floor2 >> (divisions.bit_length() - 1)
    if step == 0:
        return floor2 << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, divisions: Sequence[int] = ()) -> int:
    """The block size a request of `size` bytes is rounded to. divisions:
    the roundup_power2_divisions table (one entry per bucket from 1 MiB; 0
    or 1 means plain 512 B rounding; empty: none)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    bucket = min(max(size.bit_length() - 21, 0), ROUNDUP_INTERVALS - 1)
    d = divisions[bucket] if bucket < len(divisions) else 0  # a shorter table: the rest are 0
    if d > 1 and size > MIN_BLOCK * d:
        return _next_division(size, int(d))
    return (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def round_sizes(sizes: np.ndarray, divisions: Sequence[int] = ()) -> np.ndarray:
    """round_size of every element (int64). The 512-byte rule is computed
    for all at once; where the table divides a bucket, round_size runs once
    per distinct size that may fall in it (captures repeat a few sizes)."""
    s = np.asarray(sizes, dtype=np.int64)
    out = np.maximum((s + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK, MIN_BLOCK)
    table = tuple(int(d) for d in divisions)
    if not len(s) or max(table, default=0) <= 1:
        return out
    divided = np.flatnonzero(s > MIN_BLOCK * 2)  # (a division needs d > 1 and size > 512 * d)
    uniq, inverse = np.unique(s[divided], return_inverse=True)
    rounded = np.fromiter((round_size(int(v), table) for v in uniq.tolist()), np.int64, len(uniq))
    out[divided] = rounded[np.asarray(inverse).reshape(-1)]
    return out


def allocation_size(size: int, large_segment_size: int = LARGE_BUFFER) -> int:
    """The size of the segment cudaMalloc'd for a rounded request of `size` bytes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return large_segment_size
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
