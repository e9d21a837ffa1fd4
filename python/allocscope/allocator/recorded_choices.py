"""What a faithful replay takes from the recording where the baseline or
the model cannot know it: which of two baseline segments c10 ranks first
(their creation order decides between free blocks of equal size from torch
2.12 on, and a baseline does not hold it), and where a checkpoint restore
puts its blocks (setCheckpointPoolState)."""

from __future__ import annotations

import bisect

from .blocks import ADDR_MASK, Block, Segment
from .core import AllocatorCore

__all__ = ["RecordedChoices"]


class RecordedChoices:
    """Allocations made as recorded."""

    def malloc_as_recorded(self: AllocatorCore, size: int, stream: int, pool_id: tuple[int, int] | None,
                           addr: int, placed: bool, faithful: bool) -> Block:
        """An allocation the recording made, so never failed (force): a
        checkpoint restore's block where it was placed, else malloc, the
        recorded address settling the order of baseline segments where a
        faithful replay finds it tied."""
        b = self.place(addr, size) if placed else None
        if b is None:
            self.force, self.hint = True, addr if faithful else None
            try:
                b = self.malloc(size, stream, pool_id)
            finally:
                self.force, self.hint = False, None
        assert b is not None
        return b

    def place(self: AllocatorCore, addr: int, size: int) -> Block | None:
        """setCheckpointPoolState putting back a checkpointed block
        (setSegmentStateToCheckpoint): the free block at addr, split where it
        is larger than size, whatever the best fit and the split rules would
        choose. None where no free block starts at addr (the replay has
        diverged)."""
        block = self.blocks.get(addr)
        if block is None or block.allocated or block.addr != addr or block.size < size:
            return None
        self._remove_free(block)
        return self._alloc_found_block(block, size, size, block.stream, block.size > size)

    def _learn_order(self: AllocatorCore, lst: list[int], i: int, b: Block, size: int) -> tuple[int, Block]:
        """Where the best fit ties with the block the recording took (same
        size, later in the free list only by segment order) and both
        segments came from the baseline, whose order was a guess: the
        recording's choice says which segment c10 ranks first, and from here
        on they rank so."""
        if b.seg.order > self.baseline_orders or b.seg.expandable:
            return i, b
        blocks = self.blocks
        for j in range(i + 1, len(lst)):
            c = blocks[lst[j] & ADDR_MASK]
            if c.size != b.size:
                break
            if c.addr == self.hint:
                if c.seg.order <= self.baseline_orders and not c.seg.expandable:
                    self._swap_order(b.seg, c.seg)
                    i = bisect.bisect_left(lst, size << self._size_shift)
                    return i, blocks[lst[i] & ADDR_MASK]
                break
        return i, b

    def _swap_order(self: AllocatorCore, s1: Segment, s2: Segment) -> None:
        listed = [blk for blk in self.blocks.values()
                  if blk.seg is s1 or blk.seg is s2
                  if not blk.allocated and not blk.pending and blk.mapped]
        for blk in listed:
            self._remove_free(blk)
        s1.order, s2.order = s2.order, s1.order
        for blk in listed:  # gc_base kept: only the order changed
            bisect.insort(blk.pool.free[blk.stream], self._key(blk))
