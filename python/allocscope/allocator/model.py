"""A model of PyTorch's CUDA caching allocator (c10 DeviceCachingAllocator),
one instance per device, that replays requests: allocations with their size
and stream, frees, completions of cross-stream frees, empty_cache calls and
memory-fraction changes.

It follows the native allocator's algorithm (docs/allocator.md; torch's
c10/cuda/CUDACachingAllocator.cpp) decision for decision:

- round_size and allocation_size (sizes.py);
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
- expandable segments (expandable.py);
- a block freed after use on another stream stays unusable until its
  recorded FREE_COMPLETED (or until a release synchronizes every stream).

- private pools (CUDA graph captures, torch.cuda.MemPool): the requests a
  capture routes to one (the replay is told which, from the recording), its
  use count, and its release by release_cached_blocks once no capture uses
  it; while a capture is underway a failing malloc does not release cached
  blocks.

Not modelled: FreeCudaMemoryCallbacks, memory pools with their own allocator.
"""

from __future__ import annotations

import bisect
import copy
import re
from typing import Callable

from .blocks import ADDR_MASK as _MASK
from .blocks import KEY_SHIFT as _SHIFT
from .blocks import (SEGMENT_ALLOC, SEGMENT_FREE, AddressSource, Block, BumpAddresses, Pool, PoolId, PrivatePool,
                     Segment, SegmentEvent, SegmentListener)
from .config import AllocatorConfig
from .expandable import ExpandableSegments
from .hashmap import FlatHashMap, mempool_hash
from .private_pools import PrivatePools
from .recorded_choices import RecordedChoices
from .sizes import MIN_BLOCK, SIZE_MAX, SMALL_SIZE, allocation_size, round_size

__all__ = ["DeviceAllocator", "free_block_order"]


def free_block_order(torch_version: str | None) -> bool:
    """Whether the torch that recorded a capture orders free blocks of equal
    size by segment creation before address: 2.11 does not, 2.14 does (read
    from their libc10_cuda.so); 2.12 and 2.13 are assumed to do as 2.14.
    Unknown versions: as 2.11."""
    m = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (2, 12)


class DeviceAllocator(ExpandableSegments, PrivatePools, RecordedChoices):
    """One device's caching allocator. Replay drives it; its state is
    readable at any point (state.segments(), the counters)."""

    def __init__(self, config: AllocatorConfig, *, device: int = 0, total: int = 0, capacity: int | None = None,
                 addresses: AddressSource | None = None, segment_order: bool = False,
                 on_segment_event: SegmentListener | None = None,
                 recorded_frees: Callable[[int], list[int]] | None = None):
        """segment_order: free blocks of equal size are taken in segment
        creation order before address order (torch >= 2.12, see
        free_block_order). on_segment_event: called with each segment event
        as it happens (the replay checks them against the recording).
        recorded_frees(n): the addresses of the next n segments the
        recording frees (a faithful replay), which tell the size of c10's map
        of freeable pools (private_pools.py)."""
        self.config = config
        self.device = device
        self.total = total  # the device's memory (cudaMemGetInfo total)
        self.capacity = capacity  # bytes cudaMalloc can give this allocator (None: unlimited)
        self.allowed: int | None = None  # set_per_process_memory_fraction's limit
        self._addresses = addresses or BumpAddresses(1 << 40)
        self.small, self.large = Pool(True), Pool(False)
        self.private: dict[PoolId, PrivatePool] = {}
        # No capture uses these: released when empty, in c10's hash-map order.
        self.freeable: FlatHashMap[PoolId, PrivatePool] = FlatHashMap(mempool_hash)
        self.recorded_frees = recorded_frees
        self.captures: list[PoolId] = []  # captures underway (beginAllocateToPool)
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
        # Segments numbered up to this came from a baseline, which does not say
        # in which order they were made; hint: the address the recording gave
        # the allocation being replayed, which settles that order where it
        # decides between free blocks of equal size (_learn_order).
        self.baseline_orders = 0
        self.hint: int | None = None
        self._on_segment_event = on_segment_event

    # ---- settings

    def set_config(self, config: AllocatorConfig) -> None:
        """The program changed the settings (_set_allocator_settings): they
        apply from the next request on, as c10 reads them on each."""
        self.config = config
        self._divisions = config.roundup_power2_divisions

    def set_fraction(self, fraction: float) -> None:
        self.allowed = int(fraction * self.total)

    @property
    def _gc_active(self) -> bool:
        return self.allowed is not None and self.config.garbage_collection_threshold > 0

    # ---- the public operations (torch's malloc / free / emptyCache)

    def malloc(self, orig_size: int, stream: int, pool_id: PoolId | None = None) -> Block | None:
        """Allocates like DeviceCachingAllocator::malloc; None where it throws
        OutOfMemoryError (unless self.force). pool_id: the private pool a
        capture routed the request to (None: the shared pools)."""
        size = round_size(orig_size, self._divisions)
        owner = self.private_pool(pool_id) if pool_id is not None and pool_id != (0, 0) else None
        if owner is not None:
            pool = owner.small if size <= SMALL_SIZE else owner.large
        else:
            pool = self.small if size <= SMALL_SIZE else self.large
        alloc_size = allocation_size(size, self.config.large_segment_size)
        block = self._get_free_block(pool, stream, size)
        if block is None:
            if self._gc_active:
                self._garbage_collect()
            block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None and self._release_available_cached_blocks(pool, stream, size):
                block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None and not self.captures:
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

    def trial(self, ready: list[Block], size: int, stream: int, pool_id: PoolId | None = None) -> list[SegmentEvent]:
        """The segment events malloc(size, stream) would make if the pending
        blocks `ready` completed first: tried on a copy, this state is left
        as it is."""
        shared = {id(x): x for x in (self._addresses, self._on_segment_event, self.recorded_frees)}
        trial, blocks = copy.deepcopy((self, ready), shared)
        events: list[SegmentEvent] = []
        trial._on_segment_event = events.append
        trial.recorded_frees = None
        trial.force = False
        for b in blocks:
            trial.complete(b)
        trial.malloc(size, stream, pool_id)
        return events

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

    def insert_free(self, block: Block) -> None:
        """Puts a free block in its pool's free list (also for loading a state)."""
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

    def insert_unmapped(self, block: Block) -> None:
        """Records an unmapped range of an expandable segment (also for loading a state)."""
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

    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
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
        if self.hint is not None and self.segment_order and b.addr != self.hint:
            i, b = self._learn_order(lst, i, b, size)
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
            self.insert_free(rest)
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
        self.insert_free(block)

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
        event = SegmentEvent(kind, addr, size, stream, self.request)
        self.events.append(event)
        if self._on_segment_event is not None:
            self._on_segment_event(event)

    def _fits(self, size: int) -> bool:
        return self.capacity is None or self.reserved + size <= self.capacity

    def _grow(self, size: int) -> None:
        self.reserved += size
        self.num_device_alloc += 1
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved

    def _alloc_block(self, pool: Pool, stream: int, size: int, alloc_size: int, retry: bool) -> Block | None:
        if retry:
            self.num_alloc_retries += 1
        if self.allowed is not None and self.reserved + alloc_size > self.allowed:
            return None
        if self.config.expandable_segments:
            block = self._alloc_expandable(pool, stream, size)
            if block is not None and pool.owner is not None:
                pool.owner.segments += 1
            return block
        if not self._fits(alloc_size):
            return None  # cudaMalloc fails
        addr = self._addresses(SEGMENT_ALLOC, alloc_size)
        if pool.owner is not None:
            pool.owner.segments += 1
        seg = self.new_segment(addr, alloc_size, stream, pool.small,
                               pool_id=pool.owner.id if pool.owner is not None else (0, 0))
        block = Block(addr, alloc_size, stream, pool, seg)
        self.blocks[addr] = block
        self._grow(alloc_size)
        self._emit(SEGMENT_ALLOC, addr, alloc_size, stream)
        return block

    def _release_block(self, block: Block) -> None:
        self._emit(SEGMENT_FREE, block.addr, block.size, block.stream)
        self.num_device_free += 1
        self.reserved -= block.size
        if block.pool.owner is not None:
            block.pool.owner.segments -= 1
        self._remove_free(block)
        del self.blocks[block.addr]

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int) -> bool:
        max_split = self.config.max_split_size
        if max_split == SIZE_MAX:
            return False
        key_size = max(size, max_split)
        lst = pool.free.get(stream) or []
        i = bisect.bisect_left(lst, key_size << self._size_shift)
        if i == len(lst) or self.blocks[lst[i] & _MASK].seg.expandable:
            # No single block is large enough (or the one found is part of an
            # expandable segment): free oversize blocks from the one below it,
            # largest first, passing over expandable segments' (c10 frees
            # only whole segments here).
            released, j = 0, i - 1
            while released < key_size and j >= 0 and (lst[j] >> self._size_shift) >= max_split:
                b = self.blocks[lst[j] & _MASK]
                if not b.seg.expandable:
                    released += b.size
                    self._release_block(b)
                j -= 1
            return released >= key_size
        self._release_block(self.blocks[lst[i] & _MASK])
        return True

    def _synchronize_and_free_events(self) -> None:
        pending, self.pending = self.pending, []
        for b in pending:
            self._free_block(b)

    def _release_cached_blocks(self) -> None:
        self._synchronize_and_free_events()
        self._release_blocks(self.large)
        self._release_blocks(self.small)
        self._release_freeable_pools()

    def _free_in_order(self, pool: Pool) -> list[Block]:
        """The pool's free blocks in torch's set order: (stream, size, [segment order,] address)."""
        return [self.blocks[k & _MASK] for s in sorted(pool.free) for k in pool.free[s]]

    def _release_blocks(self, pool: Pool) -> None:
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

    # ---- state

    def largest_free(self) -> int:
        """The largest cached free block (any pool, any stream)."""
        best = 0
        pools = [self.small, self.large] + [p for owner in self.private.values() for p in (owner.small, owner.large)]
        for pool in pools:
            for lst in pool.free.values():
                if lst:
                    best = max(best, lst[-1] >> self._size_shift)
        return best

    def free_blocks(self) -> list[Block]:
        return [b for b in self.blocks.values() if not b.allocated and not b.pending]


