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
    """Bytes of the segments held by private pools before event `end`: a
    segment is a pool's where the allocation it was made for was served
    from a pool (a POOL_ALLOC marker follows its SEGMENT_ALLOC); it is held
    until its SEGMENT_FREE. (A pool's segments are never expandable: c10
    maps expandable segments for the shared pools only.)"""
    ev = cap.events
    kinds = ev.kind[:end]
    made = np.flatnonzero((kinds[:-1] == EventKind.SEGMENT_ALLOC) & (kinds[1:] == EventKind.POOL_ALLOC))
    if not len(made):
        return 0
    freed = np.flatnonzero(kinds == EventKind.SEGMENT_FREE)
    live: dict[int, int] = {}  # a pool's segments, by address
    for i in np.sort(np.concatenate((made, freed))).tolist():
        if ev.kind[i] == EventKind.SEGMENT_ALLOC:
            live[int(ev.addr[i])] = int(ev.size[i])
        else:
            live.pop(int(ev.addr[i]), None)
    return sum(live.values())


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
