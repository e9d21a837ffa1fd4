"""What a capture's baselines say about the device as a whole (docs/format.md,
BASELINE): the bytes the caching allocator held, the device's memory in use
outside it (the CUDA context, libraries, NCCL's buffers), and which baseline
read the devices. Read by the attribution's waterfall and the reports; the
baseline's segments and blocks, as the allocator's records, are
allocator/segments.py's."""

from __future__ import annotations

from typing import Any

__all__ = ["baseline_reserved", "closing_baseline", "device_readings", "nccl_memory", "outside_allocator",
           "outside_at_peak"]


def baseline_reserved(baseline: dict[str, Any] | None, device: int | None = None) -> int:
    """Bytes the caching allocator held from the device (all devices: None)."""
    return sum(int(s["total_size"]) for s in (baseline or {}).get("segments") or ()
               if device is None or int(s.get("device", 0)) == device)


def nccl_memory(baseline: dict[str, Any]) -> tuple[int, int] | None:
    """NCCL's own device memory (its connection and NVLS buffers) at the
    baseline and the most it held before, where the baseline knows it (the
    virtual GPU's NCCL: docs/vgpu.md); None elsewhere."""
    cards = [d["virtual"] for d in baseline.get("devices") or () if isinstance(d.get("virtual"), dict)]
    if not cards:
        return None
    return (sum(int(c.get("nccl", 0)) for c in cards), sum(int(c.get("nccl_peak", 0)) for c in cards))


def device_readings(cap: Any) -> dict[str, Any] | None:
    """The first baseline of a capture that read its devices' memory: the
    start's, or the end's where the process had no CUDA context yet when
    recording started (docs/format.md: reading would have created one),
    else any that did (a process killed before its end)."""
    for base in (cap.baseline("start"), cap.baseline("end"), *cap.baselines):
        if base and any("total" in d for d in base.get("devices") or ()):
            return base
    return None


def closing_baseline(cap: Any) -> dict[str, Any] | None:
    """The baseline that says the devices' memory as a run ended: the end's;
    where the process did not stop cleanly (a serving engine's core is
    killed at shutdown), the last one taken that read the devices; else the
    start's."""
    end = cap.baseline("end")
    if end is not None:
        return end
    for base in reversed(cap.baselines):
        if any("used" in d for d in base.get("devices") or ()):
            return base
    return cap.recording_start()


def outside_at_peak(baseline: dict[str, Any]) -> int | None:
    """outside_allocator, with NCCL's memory at its most (communicators
    destroyed before the baseline was read held it during the run)."""
    outside = outside_allocator(baseline)
    nccl = nccl_memory(baseline)
    return outside if outside is None or nccl is None else outside - nccl[0] + nccl[1]


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
