"""Expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), the
part of DeviceAllocator that follows c10's ExpandableSegment: one virtual
range per stream and pool, mapped in pages (2 MiB small, large_segment_size
large) at the lowest address that fits, unmapped page by page on release.

A mixin of DeviceAllocator (model.py), kept apart because the rest of the
allocator touches it only through _alloc_expandable and _unmap_block.
"""

from __future__ import annotations

from .blocks import SEGMENT_MAP, SEGMENT_UNMAP, Block, Pool
from .core import AllocatorCore
from .sizes import SMALL_BUFFER

__all__ = ["ExpandableSegments"]


class ExpandableSegments:
    """Mapping and unmapping the pages of expandable segments."""

    def _alloc_expandable(self: AllocatorCore, pool: Pool, stream: int, size: int) -> Block | None:
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

    def _find_expandable_block(self: AllocatorCore, pool: Pool, stream: int, size: int) -> Block:
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
        seg = self.new_segment(addr, pages * page, stream, pool.small, True, page,
                               pool.owner.id if pool.owner is not None else (0, 0))
        c = Block(addr, pages * page, stream, pool, seg, mapped=False)
        self.insert_unmapped(c)
        return c

    def _map_block(self: AllocatorCore, block: Block, size: int) -> bool:
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
            self.insert_unmapped(rest)
            block.size = mapped
        start = block.addr
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self.blocks[block.addr] = block
        self.insert_free(block)
        self._grow(mapped)
        self._emit(SEGMENT_MAP, start, mapped, block.stream)
        return True

    def _unmap_block(self: AllocatorCore, block: Block) -> None:
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
            self.insert_free(bf)
        after = block.size - before - u_size
        if after > 0:
            af = Block(u_addr + u_size, after, block.stream, block.pool, seg)
            af.prev, af.next = block, block.next
            if block.next is not None:
                block.next.prev = af
            block.next = af
            self.blocks[af.addr] = af
            self.insert_free(af)
        block.addr, block.size, block.mapped = u_addr, u_size, False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self.insert_unmapped(block)
        self.reserved -= u_size
        self.num_device_free += 1
        if block.pool.owner is not None:
            block.pool.owner.segments -= 1
        self._emit(SEGMENT_UNMAP, u_addr, u_size, block.stream)
