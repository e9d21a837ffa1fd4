"""Array helpers the analysis shares, for event columns of millions of rows.

np.unique sorts: on 5 million ids it takes about a second, where the ids are
small integers (string ids, stack ids, symbols) that a table indexed by
value factorizes in a few hundredths of a second. factorize() takes that
route where the values' range allows it and np.unique's otherwise; both
give the same answer (tests/unit/test_arrays.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["factorize", "first_index"]

# A table indexed by value is used while the values' range is at most this
# many times their count (plus a fixed allowance): its memory stays of the
# order of the input's.
_DENSE_FACTOR = 4
_DENSE_ALLOWANCE = 1 << 20


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values in ascending order, each value's position among
    them): np.unique(values, return_inverse=True) for a 1-D integer array."""
    v = np.asarray(values).reshape(-1)
    if not len(v) or v.dtype.kind not in "iu":
        uniq, inverse = np.unique(v, return_inverse=True)
        return uniq, np.asarray(inverse, np.int64).reshape(-1)
    lo, hi = int(v.min()), int(v.max())
    if hi - lo >= _DENSE_FACTOR * len(v) + _DENSE_ALLOWANCE:
        uniq, inverse = np.unique(v, return_inverse=True)
        return uniq, np.asarray(inverse, np.int64).reshape(-1)
    # (unsigned 64-bit values may not fit int64 before the offset is taken)
    offset = (v - np.uint64(lo)).astype(np.int64) if v.dtype == np.uint64 else v.astype(np.int64) - lo
    present = np.zeros(hi - lo + 1, bool)
    present[offset] = True
    code_of = np.cumsum(present, dtype=np.int64) - 1
    uniq = np.flatnonzero(present).astype(v.dtype) + v.dtype.type(lo)  # (wraps back into range)
    return uniq, code_of[offset]


def first_index(codes: np.ndarray, count: int) -> np.ndarray:
    """For codes in [0, count), the position of each code's first occurrence
    (len(codes) for a code that does not occur): np.unique's return_index
    from factorize's codes."""
    first = np.full(count, len(codes), np.int64)
    np.minimum.at(first, codes, np.arange(len(codes), dtype=np.int64))
    return first
