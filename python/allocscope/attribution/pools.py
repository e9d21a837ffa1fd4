"""Memory of private pools (CUDA graphs', torch.cuda.MemPool's), read from
the capture's own events: the segments a pool holds, and the allocations
it served. A capture says so with a POOL_ALLOC marker right before the
ALLOC (or SEGMENT_ALLOC + ALLOC) a pool served (docs/format.md)."""

from __future__ import annotations

import numpy as np

from ..capture.format import EventKind
from ..capture.reader import Capture
from .categories import Attribution

__all__ = ["private_pool_reserved", "private_pool_rows"]


def private_pool_reserved(cap: Capture, end: int) -> int:
    """Bytes of device memory held by private pools before event `end`: a
    segment (or, with expandable segments, a range mapped) is a pool's
    where the allocation it was made for was served from a pool (a
    POOL_ALLOC marker follows its SEGMENT_ALLOC or SEGMENT_MAP); it is held
    until its SEGMENT_FREE, or the part of it a SEGMENT_UNMAP unmaps.
    (A newer c10 maps expandable segments for CUDA graphs' pools too, an
    older one for the shared pools only.)"""
    ev = cap.events
    kinds = ev.kind[:end]
    grown = (kinds[:-1] == EventKind.SEGMENT_ALLOC) | (kinds[:-1] == EventKind.SEGMENT_MAP)
    made = np.flatnonzero(grown & (kinds[1:] == EventKind.POOL_ALLOC))
    if not len(made):
        return 0
    gone = np.flatnonzero((kinds == EventKind.SEGMENT_FREE) | (kinds == EventKind.SEGMENT_UNMAP))
    held: list[tuple[int, int]] = []  # [start, end) address ranges the pools hold
    pools_made = set(made.tolist())
    for i in np.sort(np.concatenate((made, gone))).tolist():
        a, n = int(ev.addr[i]), int(ev.size[i])
        if i in pools_made:
            held.append((a, a + n))
            continue
        # what a free or an unmap gives back of the pools' ranges
        kept = []
        for lo, hi in held:
            if hi <= a or lo >= a + n:
                kept.append((lo, hi))
                continue
            if lo < a:
                kept.append((lo, a))
            if hi > a + n:
                kept.append((a + n, hi))
        held = kept
    return sum(hi - lo for lo, hi in held)


def private_pool_rows(att: Attribution) -> np.ndarray:
    """Per row: whether a private pool served its allocation (the event
    before its ALLOC is a POOL_ALLOC marker at its address)."""
    ev = att.capture.events
    before = att.start - 1
    ok = before >= 0
    out = np.zeros(att.rows, bool)
    b = before[ok]
    out[ok] = (ev.kind[b] == EventKind.POOL_ALLOC) & (ev.addr[b] == att.addr[ok])
    return out
