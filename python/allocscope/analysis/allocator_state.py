"""Reading and writing a DeviceAllocator's state as torch's snapshot shows
it: loading a baseline's segments (docs/format.md, BASELINE) as the initial
state, and listing segments with their blocks at any moment."""

from __future__ import annotations

from typing import Any

from .simulator import SMALL_BUFFER, Block, DeviceAllocator, Segment, _Pool

__all__ = ["baseline_segments", "load_segments", "segments"]


def segments(dev: DeviceAllocator) -> list[dict[str, Any]]:
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
                out.append(_segment_json(dev.device, seg, run))
                run = []
            run.append(b)
        out.append(_segment_json(dev.device, seg, run))
    out.sort(key=lambda s: s["address"])
    return out


def baseline_segments(dev: DeviceAllocator) -> list[dict[str, Any]]:
    """The state as a BASELINE's `segments` (docs/format.md): what the
    recorder would have written, for synthetic captures and imports."""
    out = []
    for s in segments(dev):
        blocks = [[size, requested if state != "inactive" else 0, state == "allocated", state != "inactive"]
                  for _, size, requested, state, _ in s["blocks"]]
        out.append({k: v for k, v in s.items() if k != "blocks"} | {
            "requested_size": sum(b[1] for b in blocks), "allocated_size": sum(b[0] for b in blocks if b[2]),
            "active_size": sum(b[0] for b in blocks if b[3]), "blocks": blocks})
    return out


# ---- loading a baseline


def load_segments(dev: DeviceAllocator, segments: list[dict[str, Any]]) -> dict[int, Block]:
    """Sets the state from a baseline's segments (docs/format.md,
    BASELINE); returns the allocated blocks by address."""
    live: dict[int, Block] = {}
    expandable: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for s in sorted(segments, key=lambda s: int(s["address"])):
        if s.get("is_expandable"):
            expandable.setdefault((int(s["stream"]), not s["is_large"]), []).append(s)
            continue
        pool = _pool_for(dev, s)
        # A baseline does not say in which order its segments were created:
        # address order stands in for it (a real card's addresses mostly ascend).
        seg = dev.new_segment(int(s["address"]), int(s["total_size"]), int(s["stream"]), pool.small,
                              pool_id=tuple(s.get("pool") or (0, 0)))  # type: ignore[arg-type]
        _load_blocks(dev, s, seg, pool, live, None)
    for (stream, small), ranges in expandable.items():
        pool = dev.small if small else dev.large
        page = SMALL_BUFFER if small else dev.config.large_segment_size
        total = dev.total or (1 << 40)
        va = -(-(total + total // 8) // page) * page
        seg: Segment | None = None
        tail: Block | None = None
        for s in ranges:
            addr = int(s["address"])
            if seg is None or addr >= seg.addr + seg.size:
                _close_expandable(dev, seg, tail)
                seg, tail = dev.new_segment(addr, va, stream, small, True, page), None
            if tail is not None and tail.addr + tail.size < addr:  # an unmapped gap
                gap = Block(tail.addr + tail.size, addr - tail.addr - tail.size, stream, pool, seg, False)
                gap.prev, tail.next = tail, gap
                dev._insert_unmapped(gap)
                tail = gap
            first_page = (addr - seg.addr) // page
            n = int(s["total_size"]) // page
            seg.pages.extend([False] * (first_page + n - len(seg.pages)))
            for i in range(first_page, first_page + n):
                seg.pages[i] = True
            tail = _load_blocks(dev, s, seg, pool, live, tail)
        _close_expandable(dev, seg, tail)
    return live


def _close_expandable(dev: DeviceAllocator, seg: Segment | None, tail: Block | None) -> None:
    if seg is None or tail is None:
        return
    end = tail.addr + tail.size
    if end < seg.addr + seg.size:
        rest = Block(end, seg.addr + seg.size - end, tail.stream, tail.pool, seg, False)
        rest.prev, tail.next = tail, rest
        dev._insert_unmapped(rest)


def _pool_for(dev: DeviceAllocator, s: dict[str, Any]) -> _Pool:
    pool_id = tuple(int(x) for x in (s.get("pool") or (0, 0)))
    small = not s["is_large"]
    if pool_id == (0, 0):
        return dev.small if small else dev.large
    pools = dev.private.setdefault(pool_id, (_Pool(True, True), _Pool(False, True)))  # type: ignore[index]
    return pools[0] if small else pools[1]


def _load_blocks(dev: DeviceAllocator, s: dict[str, Any], seg: Segment, pool: _Pool, live: dict[int, Block],
                 prev: Block | None) -> Block | None:
    addr = int(s["address"])
    stream = int(s["stream"])
    for size, requested, allocated, active in s["blocks"]:
        b = Block(addr, int(size), stream, pool, seg)
        b.prev = prev
        if prev is not None:
            prev.next = b
        dev.blocks[addr] = b
        if allocated or active:
            b.allocated = bool(allocated)
            b.pending = not allocated
            b.requested = int(requested)
            dev.active += b.size
            dev.requested += b.requested
            if allocated:
                dev.allocated += b.size
                live[addr] = b
            else:
                dev.pending.append(b)
        else:
            dev._insert_free(b)
        prev = b
        addr += b.size
    dev.reserved += int(s["total_size"])
    dev.peak_reserved = max(dev.peak_reserved, dev.reserved)
    dev.peak_allocated = max(dev.peak_allocated, dev.allocated)
    return prev


def _segment_json(device: int, seg: Segment, run: list[Block]) -> dict[str, Any]:
    return {
        "device": device, "address": run[0].addr, "total_size": sum(b.size for b in run), "stream": seg.stream,
        "is_large": not seg.small, "is_expandable": seg.expandable, "pool": list(seg.pool_id),
        "blocks": [[b.addr, b.size, b.requested, b.state, b.tag] for b in run],
    }
