"""Attribution of a capture read from a checkpoint (load(from_step=...);
docs/format.md, CHECKPOINT): the allocations it put back were live where
it was taken, so its baseline, the capture's start baseline then, holds
their blocks."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..capture.reader import Capture

__all__ = ["put_back"]


def put_back(cap: Capture, addr: np.ndarray, start: np.ndarray, end: np.ndarray, block: np.ndarray,
             blocks: dict[int, Any]) -> set[int]:
    """Gives the recorded rows the checkpoint put back (live at its point)
    their block sizes from its baseline (blocks: baseline_blocks), in place,
    and returns their addresses: the baseline's other blocks are memory from
    before recording."""
    k = cap.prefix_events
    held = np.flatnonzero((start < k) & (end >= k))
    for r, a in zip(held.tolist(), addr[held].tolist(), strict=True):
        b = blocks.get(int(a))
        if b is not None:
            block[r] = b[0]
    return set(addr[held].tolist())
