"""Figures about the allocator's state at one moment (a list of segments as
state.segments() gives them): what is cached, how fragmented it is, which
cached memory could not serve a given request and why, and which segments
are held by live blocks.

Definitions (docs/allocator.md):
- cached free: bytes of inactive blocks (reserved − active);
- external fragmentation: 1 − largest free block ÷ cached free;
- internal fragmentation: allocated block bytes − requested bytes (rounding
  and remainders too small to split);
- unreleasable: free bytes inside segments that also hold live blocks;
  empty_cache() cannot return them.
"""

from __future__ import annotations

from typing import Any

from .config import AllocatorConfig
from .segments import ALLOCATED, INACTIVE, PENDING_FREE, BlockInfo, SegmentInfo
from .sizes import SMALL_SIZE

__all__ = ["REASONS", "figures", "fragmented_segments", "stranded"]

# Why a cached byte could not serve a request (stranded()).
REASONS = ("other_device", "other_stream", "other_pool", "too_small", "oversize_rule", "awaiting_other_stream",
           "usable")


def figures(segments: list[SegmentInfo]) -> dict[str, Any]:
    reserved = allocated = requested = pending = free = unreleasable = 0
    largest = 0
    by_pool: dict[tuple[int, int, str], dict[str, int]] = {}
    fragmented = 0
    private = {"segments": 0, "reserved": 0, "allocated": 0}  # CUDA graphs' and MemPools' own pools
    for s in segments:
        reserved += s.total_size
        if tuple(s.pool) != (0, 0):
            private["segments"] += 1
            private["reserved"] += s.total_size
            private["allocated"] += sum(b.size for b in s.blocks if b.state == ALLOCATED)
        busy = any(b.state != INACTIVE for b in s.blocks)
        seg_free = 0
        pool = by_pool.setdefault((s.device, s.stream, s.pool_kind), {"free": 0, "largest_free": 0})
        for b in s.blocks:
            if b.state == ALLOCATED:
                allocated += b.size
                requested += b.requested
            elif b.state == PENDING_FREE:
                pending += b.size
            else:
                seg_free += b.size
                largest = max(largest, b.size)
                pool["free"] += b.size
                pool["largest_free"] = max(pool["largest_free"], b.size)
        free += seg_free
        if busy and seg_free:
            unreleasable += seg_free
            fragmented += 1
    return {
        "segments": len(segments),
        "reserved": reserved,
        "allocated": allocated,
        "requested": requested,
        "pending_free": pending,
        "cached_free": free,
        "largest_free_block": largest,
        "external_fragmentation": 0.0 if free == 0 else round(1.0 - largest / free, 4),
        "internal_fragmentation": allocated - requested,
        "unreleasable_free": unreleasable,
        "fragmented_segments": fragmented,
        "pools": [{"device": d, "stream": st, "pool": p} | v for (d, st, p), v in sorted(by_pool.items())],
        "private_pools": private,
    }


def stranded(segments: list[SegmentInfo], *, device: int, stream: int, rounded: int,
             config: AllocatorConfig) -> dict[str, int]:
    """Cached bytes that could not serve a request of `rounded` bytes on
    (device, stream), by reason (REASONS). A block is judged by the first
    rule it fails, in torch's order."""
    out = dict.fromkeys(REASONS, 0)
    small = rounded <= SMALL_SIZE
    split = config.max_split_size
    for s in segments:
        for b in s.blocks:
            if b.state == ALLOCATED:
                continue
            if b.state == PENDING_FREE:
                reason = "awaiting_other_stream"
            elif s.device != device:
                reason = "other_device"
            elif s.stream != stream:
                reason = "other_stream"
            elif (not s.is_large) != small:
                reason = "other_pool"
            elif b.size < rounded:
                reason = "too_small"
            elif rounded < split <= b.size or (rounded >= split and b.size >= rounded + config.max_non_split_rounding_size):
                reason = "oversize_rule"
            else:
                reason = "usable"
            out[reason] += b.size
    return out


def fragmented_segments(segments: list[SegmentInfo]) -> list[tuple[int, SegmentInfo, list[BlockInfo]]]:
    """(free bytes, segment, its live blocks largest first) of each segment
    holding both free and live blocks (empty_cache() cannot release it), the
    most free bytes first."""
    frag = []
    for s in segments:
        free = s.free
        live = [b for b in s.blocks if b.active]
        if free and live:
            live.sort(key=lambda b: -b.size)
            frag.append((free, s, live))
    frag.sort(key=lambda x: -x[0])
    return frag
