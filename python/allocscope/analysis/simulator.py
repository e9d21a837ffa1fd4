"""A model of PyTorch's CUDA caching allocator (c10 DeviceCachingAllocator),
one instance per device, that replays requests: allocations with their size
and stream, frees, completions of cross-stream frees, empty_cache calls and
memory-fraction changes.

It follows the native allocator's algorithm (../shared/torch_internals.md §3;
c10/cuda/CUDACachingAllocator.cpp) decision for decision:

- round_size: 512 B steps, or roundup_power2_divisions steps;
- pools: small (<= 1 MiB) and large, free blocks ordered by (stream, size,
  address) so a block is only reused on its own stream, best fit first; from
  torch 2.12 on, (stream, size, segment creation order, address) (torch 2.14's
  BlockComparatorSizeCounterAddress; 2.12 and 2.13 are assumed to be alike);
- get_free_block's max_split_size and max_non_split_rounding rules;
- new segments of 2 MiB (small), large_segment_size (requests < 10 MiB) or
  the request rounded to 2 MiB; should_split; merging freed neighbours;
- garbage_collection_threshold (with a memory fraction only), then
  release_available_cached_blocks (with max_split_size only), then
  release-and-retry of every unsplit cached block before giving up;
- expandable segments: one virtual range per stream and pool, mapped in
  pages (2 MiB small, large_segment_size large) at the lowest address that
  fits, unmapped page by page on release;
- a block freed after use on another stream stays unusable until its
  recorded FREE_COMPLETED (or until a release synchronizes every stream).

Not modelled: private pools of CUDA graph captures (their segments from the
baseline are kept apart and never reused), FreeCudaMemoryCallbacks, memory
pools with their own allocator.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Callable

from .allocator_config import SIZE_MAX, AllocatorConfig, MiB

__all__ = ["Block", "BumpAddresses", "DeviceAllocator", "Segment", "SegmentEvent", "allocation_size",
           "free_block_order", "round_size"]

MIN_BLOCK = 512
SMALL_SIZE = MiB
SMALL_BUFFER = 2 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB

# Free blocks of a pool and stream are kept as one sorted list of int keys:
# size << 64 | address, the order of torch's BlockComparatorSize, or, where
# free blocks are ordered by segment too, size << 128 | segment order << 64 |
# address. Either way the low 64 bits are the address.
_SHIFT = 64
_MASK = (1 << _SHIFT) - 1

SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = "segment_alloc", "segment_free", "segment_map", "segment_unmap"


@dataclasses.dataclass(frozen=True)
class SegmentEvent:
    """What the allocator did to device memory (the trace's SEGMENT_* entries)."""

    kind: str
    addr: int
    size: int
    stream: int
    request: int  # index of the replayed request (capture event) that caused it


def free_block_order(torch_version: str | None) -> bool:
    """Whether the torch that recorded a capture orders free blocks of equal
    size by segment creation before address: 2.11 does not, 2.14 does (read
    from their libc10_cuda.so); 2.12 and 2.13 are assumed to do as 2.14.
    Unknown versions: as 2.11."""
    import re

    m = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (2, 12)


def _next_division(size: int, divisions: int) -> int:
    if size <= 4 or divisions <= 1 or size & (size - 1) == 0:
        return size
    floor2 = 1 << (size.bit_length() - 1)
    step = floor2 >> (divisions.bit_length() - 1)
    if step == 0:
        return floor2 << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, divisions: tuple[int, ...]) -> int:
    """The block size a request of `size` bytes is rounded to."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    d = divisions[min(max(size.bit_length() - 21, 0), len(divisions) - 1)] if divisions else 0
    if d > 1 and size > MIN_BLOCK * d:
        return _next_division(size, d)
    return (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def allocation_size(size: int, large_segment_size: int) -> int:
    """The size of the segment cudaMalloc'd for a rounded request of `size` bytes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return large_segment_size
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


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

    def __init__(self, addr: int, size: int, stream: int, pool: "_Pool", seg: Segment, mapped: bool = True):
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


class _Pool:
    __slots__ = ("small", "private", "free", "unmapped", "calls")

    def __init__(self, small: bool, private: bool = False):
        self.small = small
        self.private = private
        self.free: dict[int, list[int]] = {}  # stream -> sorted keys of free mapped blocks
        self.unmapped: dict[int, list[int]] = {}  # stream -> sorted addresses of unmapped blocks
        self.calls = 0  # get_free_blocks_call_count (garbage collection ages)


# Where new segments go: (kind, size) -> address. The replay asks the
# recording first so that a faithful replay lands on the recorded addresses.
AddressSource = Callable[[str, int], int]


class DeviceAllocator:
    """One device's caching allocator. Replay drives it; its state is
    readable at any point (allocator_state.segments(), the counters)."""

    def __init__(self, config: AllocatorConfig, *, device: int = 0, total: int = 0, capacity: int | None = None,
                 addresses: AddressSource | None = None, segment_order: bool = False):
        """segment_order: free blocks of equal size are taken in segment
        creation order before address order (torch >= 2.12, see
        free_block_order)."""
        self.config = config
        self.device = device
        self.total = total  # the device's memory (cudaMemGetInfo total)
        self.capacity = capacity  # bytes cudaMalloc can give this allocator (None: unlimited)
        self.allowed: int | None = None  # set_per_process_memory_fraction's limit
        self._addresses = addresses or BumpAddresses(1 << 40)
        self.small, self.large = _Pool(True), _Pool(False)
        self.private: dict[tuple[int, int], tuple[_Pool, _Pool]] = {}
        self.blocks: dict[int, Block] = {}  # mapped blocks by address
        self.unmapped: dict[int, Block] = {}
        self.pending: list[Block] = []
        self.events: list[SegmentEvent] = []
        self.request = -1  # the capture event being replayed
        self.force = False  # replaying an allocation that succeeded when recorded: never fail it
        self.reserved = self.allocated = self.requested = self.active = 0
        self.peak_reserved = self.peak_allocated = 0
        self.num_alloc_retries = self.num_ooms = self.num_device_alloc = self.num_device_free = 0
        self.num_gc_runs = 0
        self._divisions = config.roundup_power2_divisions
        self.segment_order = segment_order
        self._size_shift = 2 * _SHIFT if segment_order else _SHIFT
        self.segments_created = 0

    # ---- settings

    def set_fraction(self, fraction: float) -> None:
        self.allowed = int(fraction * self.total)

    @property
    def _gc_active(self) -> bool:
        return self.allowed is not None and self.config.garbage_collection_threshold > 0

    # ---- the public operations (torch's malloc / free / emptyCache)

    def malloc(self, orig_size: int, stream: int) -> Block | None:
        """Allocates like DeviceCachingAllocator::malloc; None where it throws
        OutOfMemoryError (unless self.force)."""
        size = round_size(orig_size, self._divisions)
        pool = self.small if size <= SMALL_SIZE else self.large
        alloc_size = allocation_size(size, self.config.large_segment_size)
        block = self._get_free_block(pool, stream, size)
        if block is None:
            if self._gc_active:
                self._garbage_collect()
            block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None and self._release_available_cached_blocks(pool, stream, size):
                block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, size, alloc_size, True)
            if block is None:
                self.num_ooms += 1
                if not self.force:
                    return None
                capacity, allowed = self.capacity, self.allowed
                self.capacity = self.allowed = None
                try:
                    block = self._alloc_block(pool, stream, size, alloc_size, False)
                finally:
                    self.capacity, self.allowed = capacity, allowed
                assert block is not None
        return self._alloc_found_block(block, size, orig_size, stream, self._should_split(block, size))

    def free(self, block: Block, deferred: bool = False) -> None:
        """torch's free(): deferred when the block was used on other streams
        (it becomes reusable at complete())."""
        block.allocated = False
        self.allocated -= block.size
        if deferred:
            block.pending = True
            self.pending.append(block)
        else:
            self._free_block(block)

    def complete(self, block: Block) -> None:
        """A deferred free's events completed (FREE_COMPLETED)."""
        if block.pending:
            self.pending.remove(block)
            self._free_block(block)

    def empty_cache(self) -> None:
        self._release_cached_blocks()

    # ---- sizes

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK
        return size < self.config.max_split_size and remaining > SMALL_SIZE

    # ---- the free lists

    def new_segment(self, addr: int, size: int, stream: int, small: bool, expandable: bool = False, page: int = 0,
                    pool_id: tuple[int, int] = (0, 0)) -> Segment:
        """A segment, numbered in creation order."""
        self.segments_created += 1
        return Segment(addr, size, stream, small, expandable, page, pool_id, self.segments_created)

    def _key(self, block: Block) -> int:
        if self.segment_order:
            return block.size << 2 * _SHIFT | block.seg.order << _SHIFT | block.addr
        return block.size << _SHIFT | block.addr

    def _insert_free(self, block: Block) -> None:
        block.gc_base = block.pool.calls
        lst = block.pool.free.get(block.stream)
        if lst is None:
            lst = block.pool.free[block.stream] = []
        bisect.insort(lst, self._key(block))

    def _remove_free(self, block: Block) -> None:
        lst = block.pool.free[block.stream]
        key = self._key(block)
        i = bisect.bisect_left(lst, key)
        assert lst[i] == key, "free list out of sync"
        del lst[i]

    def _insert_unmapped(self, block: Block) -> None:
        self.unmapped[block.addr] = block
        bisect.insort(block.pool.unmapped.setdefault(block.stream, []), block.addr)

    def _remove_unmapped(self, block: Block) -> None:
        del self.unmapped[block.addr]
        lst = block.pool.unmapped[block.stream]
        del lst[bisect.bisect_left(lst, block.addr)]

    @staticmethod
    def _expandable_size(b: Block) -> int:
        nxt = b.next
        return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _get_free_block(self, pool: _Pool, stream: int, size: int) -> Block | None:
        if self._gc_active:
            pool.calls += 1
        lst = pool.free.get(stream)
        if not lst:
            return None
        i = bisect.bisect_left(lst, size << self._size_shift)
        if i == len(lst):
            return None
        blocks = self.blocks
        b = blocks[lst[i] & _MASK]
        if b.seg.expandable:
            if self.config.expandable_segments:
                # Best fit counts what an expandable block can grow to.
                while b.seg.expandable and i + 1 < len(lst):
                    nb = blocks[lst[i + 1] & _MASK]
                    if self._expandable_size(nb) >= self._expandable_size(b):
                        break
                    i, b = i + 1, nb
            else:
                i += 1
                while i < len(lst) and blocks[lst[i] & _MASK].seg.expandable:
                    i += 1
                if i == len(lst):
                    return None
                b = blocks[lst[i] & _MASK]
        cfg = self.config
        if size < cfg.max_split_size and b.size >= cfg.max_split_size:
            return None
        if size >= cfg.max_split_size and b.size >= size + cfg.max_non_split_rounding_size:
            return None
        del lst[i]
        return b

    # ---- allocating and freeing blocks

    def _alloc_found_block(self, block: Block, size: int, orig_size: int, stream: int, split: bool) -> Block:
        if split:
            rest = block
            block = Block(rest.addr, size, stream, rest.pool, rest.seg)
            block.prev = rest.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = rest
            rest.prev = block
            rest.addr += size
            rest.size -= size
            self.blocks[block.addr] = block
            self.blocks[rest.addr] = rest
            self._insert_free(rest)
        block.allocated = True
        block.requested = orig_size
        block.tag = self.request
        self.allocated += block.size
        self.requested += orig_size
        self.active += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def _free_block(self, block: Block) -> None:
        block.pending = False
        self.active -= block.size
        self.requested -= block.requested
        block.requested = 0
        block.tag = -1
        old = block.addr
        self._merge(block, block.prev)
        self._merge(block, block.next)
        if block.addr != old:
            del self.blocks[old]
        self.blocks[block.addr] = block
        self._insert_free(block)

    def _merge(self, dst: Block, src: Block | None) -> int:
        """torch's try_merge_blocks: dst absorbs a free neighbour src."""
        if src is None or src.allocated or src.pending or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self._remove_free(src)
            del self.blocks[src.addr]
        else:
            self._remove_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _emit(self, kind: str, addr: int, size: int, stream: int) -> None:
        self.events.append(SegmentEvent(kind, addr, size, stream, self.request))

    def _fits(self, size: int) -> bool:
        return self.capacity is None or self.reserved + size <= self.capacity

    def _grow(self, size: int) -> None:
        self.reserved += size
        self.num_device_alloc += 1
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved

    def _alloc_block(self, pool: _Pool, stream: int, size: int, alloc_size: int, retry: bool) -> Block | None:
        if retry:
            self.num_alloc_retries += 1
        if self.allowed is not None and self.reserved + alloc_size > self.allowed:
            return None
        if self.config.expandable_segments and not pool.private:
            return self._alloc_expandable(pool, stream, size)
        if not self._fits(alloc_size):
            return None  # cudaMalloc fails
        addr = self._addresses(SEGMENT_ALLOC, alloc_size)
        seg = self.new_segment(addr, alloc_size, stream, pool.small)
        block = Block(addr, alloc_size, stream, pool, seg)
        self.blocks[addr] = block
        self._grow(alloc_size)
        self._emit(SEGMENT_ALLOC, addr, alloc_size, stream)
        return block

    def _release_block(self, block: Block) -> None:
        self._emit(SEGMENT_FREE, block.addr, block.size, block.stream)
        self.num_device_free += 1
        self.reserved -= block.size
        self._remove_free(block)
        del self.blocks[block.addr]

    def _release_available_cached_blocks(self, pool: _Pool, stream: int, size: int) -> bool:
        max_split = self.config.max_split_size
        if max_split == SIZE_MAX:
            return False
        key_size = max(size, max_split)
        lst = pool.free.get(stream) or []
        i = bisect.bisect_left(lst, key_size << self._size_shift)
        if i == len(lst):
            # No single block is large enough: free oversize blocks, largest first.
            released, j = 0, i - 1
            while released < key_size and j >= 0 and (lst[j] >> self._size_shift) >= max_split:
                b = self.blocks[lst[j] & _MASK]
                if b.seg.expandable:
                    break
                released += b.size
                self._release_block(b)
                j -= 1
            return released >= key_size
        b = self.blocks[lst[i] & _MASK]
        if b.seg.expandable:
            return False
        self._release_block(b)
        return True

    def _synchronize_and_free_events(self) -> None:
        pending, self.pending = self.pending, []
        for b in pending:
            self._free_block(b)

    def _release_cached_blocks(self) -> None:
        self._synchronize_and_free_events()
        self._release_blocks(self.large)
        self._release_blocks(self.small)

    def _free_in_order(self, pool: _Pool) -> list[Block]:
        """The pool's free blocks in torch's set order: (stream, size, [segment order,] address)."""
        return [self.blocks[k & _MASK] for s in sorted(pool.free) for k in pool.free[s]]

    def _release_blocks(self, pool: _Pool) -> None:
        to_unmap = []
        for b in self._free_in_order(pool):
            if b.seg.expandable:
                to_unmap.append(b)
            elif not b.is_split:
                self._release_block(b)
        for b in to_unmap:
            self._unmap_block(b)
            if not b.mapped and not b.is_split:
                self._remove_unmapped(b)  # the whole range is unmapped: drop it (no trace event)

    def _garbage_collect(self) -> None:
        threshold = int(self.config.garbage_collection_threshold * (self.allowed or 0))
        if self.reserved <= threshold:
            return
        self.num_gc_runs += 1
        target = self.reserved - threshold
        calls = self.large.calls

        def candidates() -> list[Block]:
            return [b for b in self._free_in_order(self.large) if not b.is_split and not b.seg.expandable]

        blocks = candidates()
        if not blocks:
            return
        total_age = float(sum(calls - b.gc_base for b in blocks))
        count = len(blocks)
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for b in candidates():
                age = calls - b.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    # ---- expandable segments

    def _alloc_expandable(self, pool: _Pool, stream: int, size: int) -> Block | None:
        c = self._find_expandable_block(pool, stream, size)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None
            if not self._map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt  # it absorbed c
        self._remove_free(c)
        return c

    @staticmethod
    def _allocatable(b: Block | None) -> bool:
        return b is not None and not b.allocated and not b.pending

    def _find_expandable_block(self, pool: _Pool, stream: int, size: int) -> Block:
        def room(b: Block | None) -> bool:
            total = 0
            while total < size and self._allocatable(b):
                assert b is not None
                total += b.size
                b = b.next
            return total >= size

        for addr in list(pool.unmapped.get(stream, ())):
            c = self.unmapped[addr]
            if self._allocatable(c.prev):
                c = c.prev  # a free mapped block right before it counts too
            if room(c):
                return c
        page = SMALL_BUFFER if pool.small else self.config.large_segment_size
        total = self.total or (1 << 40)
        pages = -(-(total + total // 8) // page)
        addr = self._addresses(SEGMENT_MAP, pages * page)
        seg = self.new_segment(addr, pages * page, stream, pool.small, True, page)
        c = Block(addr, pages * page, stream, pool, seg, mapped=False)
        self._insert_unmapped(c)
        return c

    def _map_block(self, block: Block, size: int) -> bool:
        seg = block.seg
        page = seg.page
        begin = (block.addr - seg.addr) // page
        end = -(-(block.addr + size - seg.addr) // page)
        mapped = (end - begin) * page
        if mapped == 0 or not self._fits(mapped):
            return False  # cuMemCreate fails
        if len(seg.pages) < end:
            seg.pages.extend([False] * (end - len(seg.pages)))
        for i in range(begin, end):
            seg.pages[i] = True
        self._remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.stream, block.pool, seg, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            self._insert_unmapped(rest)
            block.size = mapped
        start = block.addr
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self.blocks[block.addr] = block
        self._insert_free(block)
        self._grow(mapped)
        self._emit(SEGMENT_MAP, start, mapped, block.stream)
        return True

    def _unmap_block(self, block: Block) -> None:
        seg = block.seg
        page = seg.page
        begin = -(-(block.addr - seg.addr) // page)
        end = (block.addr + block.size - seg.addr) // page
        if begin >= end:
            return
        for i in range(begin, end):
            seg.pages[i] = False
        while seg.pages and not seg.pages[-1]:
            seg.pages.pop()
        self._remove_free(block)
        del self.blocks[block.addr]
        u_addr, u_size = seg.addr + begin * page, (end - begin) * page
        before = u_addr - block.addr
        if before > 0:
            bf = Block(block.addr, before, block.stream, block.pool, seg)
            bf.prev, bf.next = block.prev, block
            if block.prev is not None:
                block.prev.next = bf
            block.prev = bf
            self.blocks[bf.addr] = bf
            self._insert_free(bf)
        after = block.size - before - u_size
        if after > 0:
            af = Block(u_addr + u_size, after, block.stream, block.pool, seg)
            af.prev, af.next = block, block.next
            if block.next is not None:
                block.next.prev = af
            block.next = af
            self.blocks[af.addr] = af
            self._insert_free(af)
        block.addr, block.size, block.mapped = u_addr, u_size, False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self._insert_unmapped(block)
        self.reserved -= u_size
        self.num_device_free += 1
        self._emit(SEGMENT_UNMAP, u_addr, u_size, block.stream)

    # ---- state

    def largest_free(self) -> int:
        """The largest cached free block (any pool, any stream)."""
        best = 0
        for pool in (self.small, self.large):
            for lst in pool.free.values():
                if lst:
                    best = max(best, lst[-1] >> self._size_shift)
        return best

    def free_blocks(self) -> list[Block]:
        return [b for b in self.blocks.values() if not b.allocated and not b.pending]


class BumpAddresses:
    """Fresh, non-overlapping addresses for segments no recording placed."""

    def __init__(self, start: int):
        self.next = start

    def __call__(self, kind: str, size: int) -> int:
        addr = self.next
        self.next += (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE + ROUND_LARGE
        return addr
