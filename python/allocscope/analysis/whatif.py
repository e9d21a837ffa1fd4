"""What-if replays and the allocator's side of the report: the state and
fragmentation at the peak, the OOM post-mortem, and ranked settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._format import EventKind
from ..reader import Capture
from .allocator_config import AllocatorConfig, parse_alloc_conf, recorded_config
from .attribution import Attribution
from .fragmentation import downsample_max, figures, pinning_blocks, stranded
from .memory import moment, user_frame
from .replay import OomRecord, Replay, replay
from .simulator import allocation_size

__all__ = ["Outcome", "allocator_section", "candidates", "oom_section", "outcome", "suggest"]

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
    f = user_frame(cap, int(cap.events.stack[o.event]))
    return o.to_json() | {"site": f"{f[0]}:{f[2]} ({f[1]})" if f else None,
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


def allocator_section(cap: Capture, att: Attribution | None, rep: Replay, *, at: int | None = None, top: int = 5,
                      points: int = 256) -> dict[str, Any]:
    """The report's `allocator` section (docs/report.md). at: the event
    whose state to show (replay(..., states_at=[at])); default the peak."""
    peak = rep.peak_event("reserved")
    state = rep.states.get(peak if at is None else at)
    out: dict[str, Any] = {
        "settings": rep.config.describe(),
        "replay": rep.fidelity.to_json() if rep.fidelity else None,
        "peak_reserved": {"event": peak, "bytes": rep.peak_reserved},
        "state_at": peak if at is None else at,
        "stats": rep.stats(),
        "replayed_until": rep.replayed_until,
        "timeline": {  # up to the last replayed event
            "reserved": downsample_max(rep.reserved[:rep.replayed_until + 2], points),
            "allocated": downsample_max(rep.allocated[:rep.replayed_until + 2], points),
            "cached_free": downsample_max(rep.cached_free[:rep.replayed_until + 2], points),
            "largest_free_block": downsample_max(rep.largest_free[:rep.replayed_until + 2], points),
        },
        "warnings": list(rep.warnings),
    }
    if state is not None:
        out["state"] = figures(state)
        out["state"]["pinned_segments"] = pinning_blocks(state, att, top=top)
    return out


def oom_section(cap: Capture, att: Attribution | None, rep: Replay, *, top: int = 10,
                try_settings: bool = True) -> dict[str, Any] | None:
    """The post-mortem of the capture's first OOM, or None if it had none."""
    recorded = [o for o in rep.ooms if o.recorded]
    oom_events = np.flatnonzero(cap.events.kind == EventKind.OOM)
    if not len(oom_events):
        return None
    e = int(oom_events[0])
    ev = cap.events
    o = next((r for r in recorded if r.event == e), None)
    frames = cap.stack(int(ev.stack[e]))
    base = cap.baseline("start") or {}
    total = next((int(d["total"]) for d in base.get("devices") or () if "total" in d), None)
    device_free = int(ev.arg[e])
    out: dict[str, Any] = {
        "event": e,
        "request": {"size": int(ev.size[e]) or int(ev.block[e]), "rounded": int(ev.block[e]) or None,
                    "stack": [str(f) for f in frames[:top]]},
        "device": {"total": total, "free_at_oom": device_free},
        "reproduced_by_replay": o is not None,
    }
    if o is None:
        out["note"] = ("the replay served this request: the allocator's state here is not the recorded one "
                       "(see allocator.replay)")
        return out
    fig = figures(o.segments)
    out["request"]["stream"] = o.stream
    out["device"]["allowed"] = o.allowed
    out["allocator"] = fig
    if total is not None:
        out["device"]["outside_pytorch"] = total - device_free - o.reserved
    out["cached_unusable"] = stranded(o.segments, device=o.device, stream=o.stream, rounded=o.rounded,
                                      config=rep.config)
    out["pinned_segments"] = pinning_blocks(o.segments, att, top=5)
    out["empty_cache_would_help"] = False  # torch released every unsplit cached block before it gave up
    if att is not None:
        m = moment(att, e, None, top)
        out["filled_by"] = {"categories": m.by_category, "modules": dict(list(m.by_module.items())[:top])}
    limit_bytes = o.allowed if o.allowed is not None else o.capacity
    if limit_bytes is not None:
        alloc = allocation_size(o.rounded, rep.config.large_segment_size)
        # Device memory the failing request was short of, after torch had
        # released every cached block it could.
        out["shortfall"] = max(0, o.reserved + alloc - limit_bytes)
    if try_settings:
        tried = []
        for text, cfg in candidates(cap)[1:]:
            r = replay(cap, cfg)
            tried.append({"settings": text, "avoids_oom": e in r.avoided_ooms and not any(
                x.event < e for x in r.ooms), "peak_reserved": r.peak_reserved})
        out["settings_tried"] = tried
    return out

