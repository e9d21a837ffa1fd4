"""A DeviceAllocator's state as torch's snapshot shows it: listing its
segments with their blocks at any moment (segments), setting it from a
baseline's segments (load_segments), and comparing two states
(compare_snapshot)."""

from __future__ import annotations

from typing import Any

from .blocks import Block, Pool, Segment
from .model import DeviceAllocator
from .segments import ALLOCATED, BlockInfo, SegmentInfo
from .sizes import SMALL_BUFFER

__all__ = ["compare_snapshot", "load_segments", "segments"]


def segments(dev: DeviceAllocator) -> list[SegmentInfo]:
    """The allocator's state as torch's snapshot shows it: one entry per
    segment (per mapped range of an expandable segment), in address
    order, with its blocks in address order."""
    by_seg: dict[int, list[Block]] = {}
    for b in dev.blocks.values():
        by_seg.setdefault(id(b.seg), []).append(b)
    out = []
    for blocks in by_seg.values():
        blocks.sort(key=lambda b: b.addr)
        seg = blocks[0].seg
        run: list[Block] = []
        for b in blocks:
            if run and (run[-1].addr + run[-1].size != b.addr):
                out.append(_segment_info(dev.device, seg, run))
                run = []
            run.append(b)
        out.append(_segment_info(dev.device, seg, run))
    out.sort(key=lambda s: s.address)
    return out


def _segment_info(device: int, seg: Segment, run: list[Block]) -> SegmentInfo:
    return SegmentInfo(device=device, address=run[0].addr, total_size=sum(b.size for b in run), stream=seg.stream,
                       is_large=not seg.small, is_expandable=seg.expandable, pool=seg.pool_id,
                       blocks=tuple(BlockInfo(b.addr, b.size, b.requested, b.state, b.tag) for b in run))


# ---- loading a baseline


def load_segments(dev: DeviceAllocator, segments: list[SegmentInfo]) -> dict[int, Block]:
    """Sets the state from a baseline's segments (segments.baseline_segments);
    returns the allocated blocks by address."""
    live: dict[int, Block] = {}
    expandable: dict[tuple[Pool, int], list[SegmentInfo]] = {}
    for s in sorted(segments, key=lambda s: s.address):
        if s.is_expandable:
            expandable.setdefault((_pool_for(dev, s), s.stream), []).append(s)
            continue
        pool = _pool_for(dev, s)
        # A baseline does not say in which order its segments were created:
        # address order stands in for it (a real card's addresses mostly ascend).
        seg = dev.new_segment(s.address, s.total_size, s.stream, pool.small, pool_id=s.pool)
        _load_blocks(dev, s, seg, pool, live, None)
    for (pool, stream), ranges in expandable.items():
        _load_expandable(dev, stream, pool, ranges, live)
    dev.baseline_orders = dev.segments_created  # guessed orders: a faithful replay corrects them (_learn_order)
    return live


def _load_expandable(dev: DeviceAllocator, stream: int, pool: Pool, ranges: list[SegmentInfo],
                     live: dict[int, Block]) -> None:
    """The mapped ranges of one stream's expandable segment of one pool, the
    unmapped gaps between them rebuilt."""
    small = pool.small
    page = SMALL_BUFFER if small else dev.config.large_segment_size
    total = dev.total or (1 << 40)
    va = -(-(total + total // 8) // page) * page
    seg: Segment | None = None
    tail: Block | None = None
    for s in ranges:
        if seg is None or s.address >= seg.addr + seg.size:
            _close_expandable(dev, seg, tail)
            seg, tail = dev.new_segment(s.address, va, stream, small, True, page, s.pool), None
        if tail is not None and tail.addr + tail.size < s.address:  # an unmapped gap
            gap = Block(tail.addr + tail.size, s.address - tail.addr - tail.size, stream, pool, seg, False)
            gap.prev, tail.next = tail, gap
            dev.insert_unmapped(gap)
            tail = gap
        first_page = (s.address - seg.addr) // page
        n = s.total_size // page
        seg.pages.extend([False] * (first_page + n - len(seg.pages)))
        for i in range(first_page, first_page + n):
            seg.pages[i] = True
        tail = _load_blocks(dev, s, seg, pool, live, tail)
    _close_expandable(dev, seg, tail)


def _close_expandable(dev: DeviceAllocator, seg: Segment | None, tail: Block | None) -> None:
    if seg is None or tail is None:
        return
    end = tail.addr + tail.size
    if end < seg.addr + seg.size:
        rest = Block(end, seg.addr + seg.size - end, tail.stream, tail.pool, seg, False)
        rest.prev, tail.next = tail, rest
        dev.insert_unmapped(rest)


def _pool_for(dev: DeviceAllocator, s: SegmentInfo) -> Pool:
    if s.pool == (0, 0):
        return dev.small if not s.is_large else dev.large
    owner = dev.private_pool(s.pool)
    owner.segments += 1
    return owner.large if s.is_large else owner.small


def _load_blocks(dev: DeviceAllocator, s: SegmentInfo, seg: Segment, pool: Pool, live: dict[int, Block],
                 prev: Block | None) -> Block | None:
    for info in s.blocks:
        b = Block(info.address, info.size, s.stream, pool, seg)
        b.prev = prev
        if prev is not None:
            prev.next = b
        dev.blocks[b.addr] = b
        if info.active:
            b.allocated = info.allocated
            b.pending = not info.allocated
            b.requested = info.requested
            dev.active += b.size
            dev.requested += b.requested
            if info.allocated:
                dev.allocated += b.size
                live[b.addr] = b
            else:
                dev.pending.append(b)
        else:
            dev.insert_free(b)
        prev = b
    dev.reserved += s.total_size
    dev.peak_reserved = max(dev.peak_reserved, dev.reserved)
    dev.peak_allocated = max(dev.peak_allocated, dev.allocated)
    return prev


def compare_snapshot(state: list[SegmentInfo], snapshot: list[SegmentInfo]) -> dict[str, Any]:
    """Compares a reconstructed state with a baseline's segments: the same
    segments (address, size, stream, pool kind) holding the same blocks (size,
    requested bytes, allocated, active)."""

    def norm(s: SegmentInfo) -> tuple:
        blocks = tuple((b.size, b.requested if b.active else 0, b.state == ALLOCATED, b.active) for b in s.blocks)
        return (s.device, s.address, s.total_size, s.stream, s.is_large, s.is_expandable, blocks)

    a = sorted(norm(s) for s in state)
    b = sorted(norm(s) for s in snapshot)
    only_model = [x[:6] for x in a if x not in b]
    only_snapshot = [x[:6] for x in b if x not in a]
    return {"equal": a == b, "segments": len(b), "only_in_replay": only_model[:5], "only_in_snapshot": only_snapshot[:5]}
