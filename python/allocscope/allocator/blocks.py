"""The pieces of the caching allocator's state, as c10 keeps them: segments
(cudaMalloc'd ranges, or an expandable segment's virtual range), blocks
(pieces of a segment, linked to their neighbours), pools (the free blocks of
one pool per stream), and the segment events the allocator emits.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .sizes import ROUND_LARGE

__all__ = ["ADDR_MASK", "KEY_SHIFT", "SEGMENT_ALLOC", "SEGMENT_FREE", "SEGMENT_MAP", "SEGMENT_UNMAP",
           "AddressSource", "Block", "BumpAddresses", "Pool", "PoolId", "PrivatePool", "Segment", "SegmentEvent",
           "SegmentListener"]

# A memory pool's id as c10 spells it (MempoolId_t): (0, 0) is the shared pools.
PoolId = tuple[int, int]

SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = "segment_alloc", "segment_free", "segment_map", "segment_unmap"


# Free blocks of a pool and stream are kept as one sorted list of int keys:
# size << 64 | address, the order of torch's BlockComparatorSize, or, where
# free blocks are ordered by segment too, size << 128 | segment order << 64 |
# address. Either way the low 64 bits are the address.
KEY_SHIFT = 64
ADDR_MASK = (1 << KEY_SHIFT) - 1


@dataclasses.dataclass(frozen=True)
class SegmentEvent:
    """What the allocator did to device memory (the trace's SEGMENT_* entries)."""

    kind: str
    addr: int
    size: int
    stream: int
    request: int  # index of the replayed request (capture event) that caused it



class Segment:
    """A cudaMalloc'd segment, or an expandable segment's virtual range."""

    __slots__ = ("addr", "size", "stream", "small", "expandable", "page", "pages", "pool_id", "order")

    def __init__(self, addr: int, size: int, stream: int, small: bool, expandable: bool = False, page: int = 0,
                 pool_id: tuple[int, int] = (0, 0), order: int = 0):
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.expandable, self.page = expandable, page
        self.pages: list[bool] = []  # expandable: which pages are mapped
        self.pool_id = pool_id
        self.order = order  # creation order (torch's registration counter); every block of it shares it


class Block:
    """A piece of a segment: allocated, pending (freed, awaiting another
    stream), free (in its pool), or unmapped (expandable address space)."""

    __slots__ = ("addr", "size", "stream", "pool", "seg", "prev", "next", "allocated", "pending", "requested",
                 "mapped", "gc_base", "tag")

    def __init__(self, addr: int, size: int, stream: int, pool: "Pool", seg: Segment, mapped: bool = True):
        self.addr, self.size, self.stream, self.pool, self.seg = addr, size, stream, pool, seg
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.pending = False
        self.requested = 0
        self.mapped = mapped
        self.gc_base = 0
        self.tag = -1  # the capture event that allocated it

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    @property
    def state(self) -> str:
        if self.allocated:
            return "allocated"
        return "pending_free" if self.pending else "inactive"


class Pool:
    """One pool (small or large; the shared one or a CUDA graph's private one)."""

    __slots__ = ("small", "owner", "free", "unmapped", "calls")

    def __init__(self, small: bool, owner: "PrivatePool | None" = None):
        self.small = small
        self.owner = owner  # the private pool it belongs to (None: the shared pools)
        self.free: dict[int, list[int]] = {}  # stream -> sorted keys of free mapped blocks
        self.unmapped: dict[int, list[int]] = {}  # stream -> sorted addresses of unmapped blocks
        self.calls = 0  # get_free_blocks_call_count (garbage collection ages)

    @property
    def private(self) -> bool:
        return self.owner is not None


class PrivatePool:
    """c10's PrivatePool: the small and large pools of a CUDA graph capture
    (or a torch.cuda.MemPool), the captures and pools that share it
    (use_count) and its live segments (cudaMalloc_count). It is freed once no
    capture uses it and its last segment is released."""

    __slots__ = ("id", "small", "large", "use_count", "segments")

    def __init__(self, pool_id: PoolId):
        self.id = pool_id
        self.small, self.large = Pool(True, self), Pool(False, self)
        self.use_count = 1
        self.segments = 0


# Where new segments go: (kind, size) -> address. The replay asks the
# recording first so that a faithful replay lands on the recorded addresses.
AddressSource = Callable[[str, int], int]
# Told of each segment event as the allocator makes it.
SegmentListener = Callable[["SegmentEvent"], None]



class BumpAddresses:
    """Fresh, non-overlapping addresses for segments no recording placed."""

    def __init__(self, start: int):
        self.next = start

    def __call__(self, kind: str, size: int) -> int:
        addr = self.next
        self.next += (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE + ROUND_LARGE
        return addr
