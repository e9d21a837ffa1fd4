"""Reading the allocator's state out of a CUDA baseline (a snapshot taken
when recording started or stopped; docs/format.md, BASELINE chunk)."""

from __future__ import annotations

from typing import Any

__all__ = ["baseline_blocks", "baseline_reserved", "outside_allocator"]


def baseline_blocks(baseline: dict[str, Any]) -> dict[int, tuple[int, int, int]]:
    """{address: (block size, requested bytes, device)} of the allocated blocks."""
    out = {}
    for seg in baseline.get("segments") or ():
        addr = int(seg["address"])
        for size, requested, allocated, _active in seg["blocks"]:
            if allocated:
                out[addr] = (int(size), int(requested), int(seg.get("device", 0)))
            addr += int(size)
    return out


def baseline_reserved(baseline: dict[str, Any]) -> int:
    """Bytes the caching allocator held from the device."""
    return sum(int(s["total_size"]) for s in baseline.get("segments") or ())


def outside_allocator(baseline: dict[str, Any]) -> int | None:
    """Device memory in use that the caching allocator does not hold (the
    CUDA context, libraries' own allocations, other processes), or None when
    the baseline has no device readings."""
    devices = [d for d in baseline.get("devices") or () if "used" in d]
    if not devices:
        return None
    used = sum(int(d["used"]) for d in devices)
    if all("stats" in d for d in devices):
        reserved = sum(int(d["stats"]["reserved_bytes"]["current"]) for d in devices)
    else:  # a baseline written without the allocator's counters (imports, older files)
        reserved = baseline_reserved(baseline)
    return used - reserved
