"""The `allocscope simulate` document: a CUDA capture replayed with its
recorded settings (how exactly the model reproduces the run), and, where
asked, with other settings or on a smaller card, and the settings worth
trying ranked (simulate; schema SCHEMA, docs/allocator.md), and its text
rendering (render)."""

from __future__ import annotations

from typing import Any

from ..allocator.config import AllocatorConfig, recorded_config
from ..allocator.recorded import recorded_reserved
from ..allocator.replay import replay
from ..allocator.whatif import outcome, suggest
from ..capture.reader import Capture
from ..common.units import format_bytes

__all__ = ["SCHEMA", "render", "simulate"]

SCHEMA = "allocscope.simulate/1"


def simulate(cap: Capture, *, config: AllocatorConfig | None = None, limit: int | None = None,
             suggestions: bool = False) -> dict[str, Any]:
    """The replay with the recorded settings; with config and/or limit (the
    total memory of another card) the what-if; with suggestions, every
    candidate setting ranked."""
    recorded = recorded_config(cap.baseline("start"), cap.metadata)
    faithful = replay(cap)
    measured = int(recorded_reserved(cap).max())
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "capture": {"path": cap.path, "events": len(cap.events), "torch": cap.metadata.get("torch")},
        "measured": {"peak_reserved": measured},
        "recorded": {"settings": recorded.describe(), "fidelity": faithful.fidelity.to_json() if faithful.fidelity
                     else None, "outcome": outcome(cap, faithful, recorded.describe()).to_json()},
    }
    if config is not None or limit is not None:
        cfg = config or recorded
        label = cfg.describe() + (f" on a {format_bytes(limit)} GPU" if limit else "")
        out["whatif"] = outcome(cap, replay(cap, cfg, limit=limit), label).to_json() | {"limit": limit}
    if suggestions:
        out["suggestions"] = [o.to_json() for o in suggest(cap, limit=limit)]
    return out


def _pct(a: int, b: int) -> str:
    return "n/a" if b == 0 else f"{(a - b) / b * 100:+.1f}%"


def _describe(o: dict[str, Any], measured: int) -> list[str]:
    lines = [f"  peak reserved {format_bytes(o['peak_reserved'])} ({_pct(o['peak_reserved'], measured)} vs measured), "
             f"peak allocated {format_bytes(o['peak_allocated'])}",
             f"  at that peak: {format_bytes(o['cached_free_at_peak'])} cached free, external fragmentation "
             f"{o['external_fragmentation_at_peak']:.1%}; {o['num_device_alloc']} device allocations, "
             f"{o['num_alloc_retries']} release-and-retries"]
    if o["oom_count"]:
        first = o["ooms"][0]
        lines.append(f"  runs out of memory {o['oom_count']} time(s); first at event {first['event']} "
                     f"({first['time_ns'] / 1e9:.3f} s in), requesting {format_bytes(first['size'])} with "
                     f"{format_bytes(first['reserved'])} reserved, at {first['site'] or '?'}")
    else:
        lines.append("  does not run out of memory")
    if o["avoided_recorded_ooms"]:
        lines.append(f"  serves {o['avoided_recorded_ooms']} request(s) that ran out of memory when recorded")
    return lines


def render(r: dict[str, Any]) -> str:
    """The simulate document as text."""
    measured = r["measured"]["peak_reserved"]
    lines = [f"{r['capture']['path']}: {r['capture']['events']} events, measured peak reserved "
             f"{format_bytes(measured)}", ""]
    rec = r["recorded"]
    lines.append(f"Replay with the recorded settings ({rec['settings']}):")
    f = rec["fidelity"]
    if f:
        lines.append(f"  segment events reproduced: {f['matched']} of {f['recorded_segment_events']} recorded "
                     f"({f['simulated_segment_events']} simulated); blocks at another address: "
                     f"{f['address_mismatches']} of {f['allocations']}")
        snap = f["end_snapshot"]
        if snap is not None:
            lines.append(f"  end snapshot: {'identical' if snap['equal'] else 'DIFFERENT'} "
                         f"({snap['segments']} segments)")
        if f["first_mismatch"]:
            m = f["first_mismatch"]
            lines.append(f"  first difference at segment event {m['position']}: recorded {m['recorded']}, "
                         f"simulated {m['simulated']}")
        lines.append("  the model reproduces this run exactly" if f["exact"] else
                     "  the model does NOT reproduce this run exactly: treat what-if numbers as estimates")
    lines += _describe(rec["outcome"], measured)
    if "whatif" in r:
        w = r["whatif"]
        lines += ["", f"What if {w['settings']}:"] + _describe(w, measured)
    if "suggestions" in r:
        lines += ["", "Settings ranked (fits first, then by peak reserved):"]
        for k, o in enumerate(r["suggestions"], 1):
            verdict = f"runs out x{o['oom_count']}" if o["oom_count"] else "fits"
            lines.append(f"  {k}. {o['settings']}: peak reserved {format_bytes(o['peak_reserved'])} "
                         f"({_pct(o['peak_reserved'], measured)}), {verdict}")
    return "\n".join(lines)
