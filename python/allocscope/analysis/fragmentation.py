"""Figures about the allocator's state at one moment (a list of segments as
DeviceAllocator.segments() gives them): what is cached, how fragmented it is,
which cached memory could not serve a given request and why, and which
allocations pin the fragmented segments.

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

import numpy as np

from .allocator_config import AllocatorConfig
from .attribution import CATEGORIES, Attribution
from .memory import user_frame
from .simulator import SMALL_SIZE

__all__ = ["REASONS", "block_rows", "figures", "pinning_blocks", "stranded"]

# Why a cached byte could not serve a request (stranded()).
REASONS = ("other_device", "other_stream", "other_pool", "too_small", "oversize_rule", "awaiting_other_stream",
           "usable")


def figures(segments: list[dict[str, Any]]) -> dict[str, Any]:
    reserved = allocated = requested = pending = free = unreleasable = 0
    largest = 0
    by_pool: dict[tuple[int, int, str], dict[str, int]] = {}
    fragmented = 0
    for s in segments:
        reserved += s["total_size"]
        busy = any(b[3] != "inactive" for b in s["blocks"])
        seg_free = 0
        key = (s["device"], s["stream"], "large" if s["is_large"] else "small")
        pool = by_pool.setdefault(key, {"free": 0, "largest_free": 0})
        for _addr, size, req, state, _tag in s["blocks"]:
            if state == "allocated":
                allocated += size
                requested += req
            elif state == "pending_free":
                pending += size
            else:
                seg_free += size
                largest = max(largest, size)
                pool["free"] += size
                pool["largest_free"] = max(pool["largest_free"], size)
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
    }


def stranded(segments: list[dict[str, Any]], *, device: int, stream: int, rounded: int,
             config: AllocatorConfig) -> dict[str, int]:
    """Cached bytes that could not serve a request of `rounded` bytes on
    (device, stream), by reason (REASONS). A block is judged by the first
    rule it fails, in torch's order."""
    out = dict.fromkeys(REASONS, 0)
    small = rounded <= SMALL_SIZE
    split = config.max_split_size
    for s in segments:
        for _addr, size, _req, state, _tag in s["blocks"]:
            if state == "allocated":
                continue
            if state == "pending_free":
                reason = "awaiting_other_stream"
            elif s["device"] != device:
                reason = "other_device"
            elif s["stream"] != stream:
                reason = "other_stream"
            elif (not s["is_large"]) != small:
                reason = "other_pool"
            elif size < rounded:
                reason = "too_small"
            elif rounded < split <= size or (rounded >= split and size >= rounded + config.max_non_split_rounding_size):
                reason = "oversize_rule"
            else:
                reason = "usable"
            out[reason] += size
    return out


def block_rows(segments: list[dict[str, Any]], att: Attribution | None) -> dict[int, int]:
    """{address: attribution row} of the busy blocks of replayed segments:
    by the event that allocated them (the block's tag), or, for blocks from
    the start baseline (tag -1), by address among the rows live from the start."""
    if att is None:
        return {}
    busy = [(b[0], b[4]) for s in segments for b in s["blocks"] if b[3] != "inactive"]
    by_event = att.rows_of([tag for _, tag in busy if tag >= 0])
    pre_rows = np.flatnonzero(att.start < 0)
    pre = dict(zip(att.addr[pre_rows].tolist(), pre_rows.tolist(), strict=True))
    out = {}
    for addr, tag in busy:
        row = by_event.get(tag) if tag >= 0 else pre.get(addr)
        if row is not None:
            out[addr] = row
    return out


def pinning_blocks(segments: list[dict[str, Any]], att: Attribution | None, *, top: int = 5,
                   blocks_per_segment: int = 5) -> list[dict[str, Any]]:
    """The fragmented segments holding the most free bytes, each with the
    live blocks that keep it from being released (their category, module and
    the user's line that allocated them)."""
    rows = block_rows(segments, att)
    frag = []
    for s in segments:
        free = sum(b[1] for b in s["blocks"] if b[3] == "inactive")
        live = [b for b in s["blocks"] if b[3] != "inactive"]
        if free and live:
            frag.append((free, s, live))
    frag.sort(key=lambda x: -x[0])
    out = []
    for free, s, live in frag[:top]:
        live.sort(key=lambda b: -b[1])
        pins = []
        for addr, size, req, state, _tag in live[:blocks_per_segment]:
            pin: dict[str, Any] = {"address": addr, "size": size, "requested": req, "state": state}
            row = rows.get(addr)
            if att is not None and row is not None:
                pin["category"] = CATEGORIES[int(att.category[row])]
                pin["module"] = att.name(int(att.module[row]))
                pin["tensor"] = att.name(int(att.label[row]))
                f = user_frame(att.capture, int(att.stack[row]))
                pin["site"] = f"{f[0]}:{f[2]} ({f[1]})" if f else None
            pins.append(pin)
        out.append({"address": s["address"], "total_size": s["total_size"], "stream": s["stream"],
                    "pool": "large" if s["is_large"] else "small", "free": free,
                    "live_blocks": len(live), "pinned_by": pins})
    return out


def downsample_max(values: np.ndarray, points: int) -> list[int]:
    """values at most `points` long, each the maximum of its slice."""
    if len(values) <= points:
        return [int(v) for v in values]
    edges = np.linspace(0, len(values), points + 1).astype(np.int64)
    return [int(v) for v in np.maximum.reduceat(values, edges[:-1])]
