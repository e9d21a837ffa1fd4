"""The allocator's segments and blocks as typed records (c10's SegmentInfo
and BlockInfo), and the one place a CUDA baseline's segments are read
(docs/format.md, BASELINE): every reader of a baseline (the replay, the
attribution, the reports, the exports) goes through baseline_segments, so
that hand-made, imported and older baselines are completed one way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .sizes import SMALL_BUFFER

__all__ = ["ALLOCATED", "INACTIVE", "PENDING_FREE", "BlockInfo", "SegmentInfo", "baseline_blocks",
           "baseline_segments", "pending_blocks"]

# A block's state, as torch's snapshot names them (less the "active_" prefix).
ALLOCATED, PENDING_FREE, INACTIVE = "allocated", "pending_free", "inactive"


@dataclasses.dataclass(frozen=True, slots=True)
class BlockInfo:
    """A block: allocated, pending_free (freed, still in use on another
    stream) or inactive (free, cached)."""

    address: int
    size: int
    requested: int  # requested bytes (an inactive block in a baseline keeps c10's stale figure: see active)
    state: str
    event: int = -1  # the capture event that allocated it (replayed states; -1: unknown, e.g. from a baseline)

    @property
    def allocated(self) -> bool:
        return self.state == ALLOCATED

    @property
    def active(self) -> bool:
        return self.state != INACTIVE


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A segment (a mapped range of an expandable segment) with its blocks
    in address order."""

    device: int
    address: int
    total_size: int
    stream: int
    is_large: bool
    is_expandable: bool
    pool: tuple[int, int]  # (0, 0): the shared pools; else a CUDA graph's private pool
    blocks: tuple[BlockInfo, ...]

    @property
    def pool_kind(self) -> str:
        return "large" if self.is_large else "small"

    @property
    def free(self) -> int:
        """Bytes of its inactive blocks."""
        return sum(b.size for b in self.blocks if not b.active)

    @classmethod
    def from_baseline(cls, s: dict[str, Any]) -> SegmentInfo:
        """A BASELINE segment, its missing fields completed: a segment
        without blocks is one block; the pool kind, where absent, from the
        size (small segments are 2 MiB)."""
        total = int(s["total_size"])
        rows = s.get("blocks")
        if rows is None:
            rows = [[total, int(s.get("requested_size", 0)), bool(s.get("allocated_size")),
                     bool(s.get("active_size"))]]
        addr = int(s["address"])
        blocks = []
        for size, requested, allocated, active in rows:
            state = ALLOCATED if allocated else PENDING_FREE if active else INACTIVE
            blocks.append(BlockInfo(addr, int(size), int(requested), state))
            addr += int(size)
        return cls(device=int(s.get("device", 0)), address=int(s["address"]), total_size=total,
                   stream=int(s.get("stream", 0)), is_large=bool(s.get("is_large", total != SMALL_BUFFER)),
                   is_expandable=bool(s.get("is_expandable", False)),
                   pool=tuple(int(x) for x in (s.get("pool") or (0, 0))),  # type: ignore[arg-type]
                   blocks=tuple(blocks))

    def to_baseline(self) -> dict[str, Any]:
        """As a BASELINE segment (what the recorder writes)."""
        rows = [[b.size, b.requested if b.active else 0, b.allocated, b.active] for b in self.blocks]
        return {"device": self.device, "address": self.address, "total_size": self.total_size,
                "stream": self.stream, "is_large": self.is_large, "is_expandable": self.is_expandable,
                "pool": list(self.pool), "requested_size": sum(r[1] for r in rows),
                "allocated_size": sum(b.size for b in self.blocks if b.allocated),
                "active_size": sum(b.size for b in self.blocks if b.active), "blocks": rows}


def baseline_segments(baseline: dict[str, Any] | None) -> list[SegmentInfo]:
    """A baseline's segments, in the order written."""
    return [SegmentInfo.from_baseline(s) for s in (baseline or {}).get("segments") or ()]


def baseline_blocks(baseline: dict[str, Any] | None) -> dict[int, tuple[int, int, int]]:
    """{address: (block size, requested bytes, device)} of the allocated blocks."""
    return {b.address: (b.size, b.requested, s.device)
            for s in baseline_segments(baseline) for b in s.blocks if b.allocated}


def pending_blocks(baseline: dict[str, Any] | None) -> set[int]:
    """Addresses of the blocks a baseline shows freed but still in use on
    another stream."""
    return {b.address for s in baseline_segments(baseline) for b in s.blocks if b.state == PENDING_FREE}
