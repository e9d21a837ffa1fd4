"""What-if replays: the same requests under other settings or on a smaller
card, each summarized as an Outcome, and the settings worth trying ranked
(`allocscope simulate --suggest`, the OOM post-mortem's "would have avoided
it"); and how large some allocations could have been on a card
(largest_total: a serving engine's KV cache that fills it)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from ..capture.baselines import closing_baseline
from ..capture.format import EventKind
from ..capture.reader import Capture
from ..capture.stacks import site
from .config import AllocatorConfig, parse_alloc_conf, recorded_config
from .recorded import device_info
from .replay import OomRecord, Replay, replay

__all__ = ["Outcome", "candidates", "largest_total", "outcome", "suggest"]

# The settings worth trying, on top of what the capture ran with.
_CANDIDATES = (
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "expandable_segments:True,roundup_power2_divisions:4",
    "garbage_collection_threshold:0.8",
)


@dataclasses.dataclass
class Outcome:
    """One what-if replay, summarized."""

    settings: str
    peak_reserved: int
    peak_allocated: int
    cached_free_at_peak: int
    external_fragmentation_at_peak: float
    ooms: list[dict[str, Any]]  # requests that would fail (first few)
    oom_count: int
    avoided_recorded_ooms: int
    num_device_alloc: int
    num_alloc_retries: int

    @property
    def runs_out(self) -> bool:
        return self.oom_count > 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"runs_out": self.runs_out}


def _oom_json(cap: Capture, o: OomRecord) -> dict[str, Any]:
    return o.to_json() | {"site": site(cap, int(cap.events.stack[o.event])),
                          "time_ns": int(cap.events.time_ns[o.event] - cap.events.time_ns[0])}


def outcome(cap: Capture, rep: Replay, settings: str) -> Outcome:
    peak = rep.peak_event("reserved")
    i = peak + 1
    free = int(rep.reserved[i] - rep.active[i])
    largest = int(rep.largest_free[i])
    return Outcome(
        settings=settings, peak_reserved=rep.peak_reserved, peak_allocated=int(rep.allocated.max()),
        cached_free_at_peak=free, external_fragmentation_at_peak=0.0 if free == 0 else round(1 - largest / free, 4),
        ooms=[_oom_json(cap, o) for o in rep.ooms[:3]], oom_count=len(rep.ooms),
        avoided_recorded_ooms=len(rep.avoided_ooms), num_device_alloc=rep.stats()["num_device_alloc"],
        num_alloc_retries=rep.stats()["num_alloc_retries"])


def candidates(cap: Capture) -> list[tuple[str, AllocatorConfig]]:
    """(settings string, config) to try: the recorded settings first."""
    base = recorded_config(cap.baseline("start"), cap.metadata)
    out = [("recorded: " + base.describe(), base)]
    seen = {base}
    for text in _CANDIDATES:
        if text.startswith("garbage_collection_threshold") and not _has_fraction(cap):
            continue  # torch only collects garbage under a memory fraction
        cfg = parse_alloc_conf(text, base)
        if cfg not in seen:
            seen.add(cfg)
            out.append((cfg.describe(), cfg))
    return out


def _has_fraction(cap: Capture) -> bool:
    devices = (cap.baseline("start") or {}).get("devices") or ()
    return bool((cap.events.kind == EventKind.SET_FRACTION).any()) or any(
        float(d.get("memory_fraction", 1.0)) < 1.0 for d in devices)


def suggest(cap: Capture, *, limit: int | None = None) -> list[Outcome]:
    """Every candidate setting replayed, best first: those that do not run
    out of memory, by peak reserved."""
    results = [outcome(cap, replay(cap, cfg, limit=limit), text) for text, cfg in candidates(cap)]
    return sorted(results, key=lambda o: (o.oom_count > 0, o.peak_reserved, o.oom_count))


def largest_total(cap: Capture, allocs: list[int], *, capacity: int, upper: int, step: int = 1 << 20) -> int | None:
    """The largest total size (a whole number of steps, at most upper) that
    the ALLOC events `allocs` could have had together, each grown in
    proportion to its recorded size, for every request of the capture to be
    served, replayed with the recorded settings where the allocator may hold
    `capacity` bytes of its device (the card's memory less what is used
    outside PyTorch's allocator), the settings changed where the program
    changed them (vLLM does, around loading its weights). The recorded
    sizes where they are the most that fits; None where even they run out.
    (What the requests after them do with a smaller card, fragmentation
    included, decides: c10's own rules, replayed.)"""
    if not allocs:
        return None
    ev = cap.events
    device = int(ev.device[allocs[0]])
    info = device_info(cap.baseline("start"), cap.metadata, closing_baseline(cap)).get(device, {})
    # replay()'s limit is a card's total memory, of which it leaves out what
    # the capture found used outside the allocator
    outside = int(info.get("total", 0)) - int(info.get("free", info.get("total", 0))) - int(info.get("reserved", 0))
    limit = capacity + max(outside, 0)
    recorded = ev.size[allocs].astype(np.int64)
    now = int(recorded.sum())

    def fits(total: int) -> bool:
        grown = recorded * total // now
        grown[-1] += total - int(grown.sum())
        size = ev.size.copy()
        size[allocs] = grown.astype(size.dtype)
        what_if = copy.copy(cap)
        what_if.events = ev.replace(size=size)
        # (no config: the recorded settings, changed where the program changed them)
        return not replay(what_if, limit=limit).ooms

    if not fits(now):
        return None
    high = upper // step  # in steps: the largest tried
    if high * step <= now:
        return now
    if fits(high * step):
        return high * step
    low = now // step  # (at most the recorded total, which fits)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    return max(low * step, now)
