"""What-if replays: the same requests under other settings or on a smaller
card, each summarized as an Outcome, and the settings worth trying ranked
(`allocscope simulate --suggest`, the OOM post-mortem's "would have avoided
it")."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..capture.format import EventKind
from ..capture.reader import Capture
from ..capture.stacks import site
from .config import AllocatorConfig, parse_alloc_conf, recorded_config
from .replay import OomRecord, Replay, replay

__all__ = ["Outcome", "candidates", "outcome", "suggest"]

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
