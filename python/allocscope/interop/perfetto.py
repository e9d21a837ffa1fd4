"""Writing a capture as Chrome trace-event JSON, which Perfetto
(ui.perfetto.dev) and chrome://tracing open: one counter track per
category of live memory (and allocated, reserved), marks and OOMs as
instant events, iterations as slices. Counters are downsampled like the
HTML timeline (each slice's highest moment), so the file stays small."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..attribution.timeline import iterations, relative_time
from ..capture.format import EventKind
from ..capture.reader import Capture
from ..reports.analysis import analyse
from ..reports.views import marks, timeline_view

__all__ = ["export_perfetto", "to_trace_events"]

PID = 1


def to_trace_events(cap: Capture, *, points: int = 10000) -> dict[str, Any]:
    """The trace-event document (what export_perfetto writes)."""
    an = analyse(cap)
    t = timeline_view(an.att, an.tl, points=points, modules=0)
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "name": "process_name", "args": {"name": f"allocscope: {cap.path}"}},
        {"ph": "M", "pid": PID, "tid": 1, "name": "thread_name", "args": {"name": "iterations"}},
        {"ph": "M", "pid": PID, "tid": 2, "name": "thread_name", "args": {"name": "marks"}},
    ]
    us = [x / 1000 for x in t["time_ns"]]
    tracks = {f"{c} (bytes)": v for c, v in t["by_category"].items()}
    tracks["allocated (bytes)"] = t["allocated"]
    if "reserved" in t:
        tracks["reserved (bytes)"] = t["reserved"]
    if "device_used" in t:
        tracks["device used (bytes)"] = t["device_used"]
    for name, values in tracks.items():
        ev += [{"ph": "C", "pid": PID, "name": name, "ts": ts, "args": {"bytes": v}} for ts, v in zip(us, values, strict=True)]
    for m in marks(cap, an.att, limit=100000):
        ev.append({"ph": "i", "s": "g", "pid": PID, "tid": 2, "name": m["label"], "ts": m["time_ns"] / 1000})
    for i in np.flatnonzero(cap.events.kind == EventKind.OOM).tolist():
        ev.append({"ph": "i", "s": "g", "pid": PID, "tid": 2, "name": "out of memory",
                   "ts": relative_time(cap, i) / 1000, "args": {"requested_bytes": int(cap.events.size[i])}})
    for it in iterations(an.att, an.tl):
        ev.append({"ph": "X", "pid": PID, "tid": 1, "name": f"iteration {it['iteration']}", "ts": it["start_ns"] / 1000,
                   "dur": max(0.001, (it["end_ns"] - it["start_ns"]) / 1000),
                   "args": {"peak_allocated_bytes": it["peak_allocated_bytes"], "leaked_bytes": it["leaked_bytes"]}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"source": "allocscope", "capture": cap.path, "events": len(cap.events)}}


def export_perfetto(cap: Capture, path: str | os.PathLike[str], *, points: int = 10000) -> int:
    """Writes the trace JSON; returns its size in bytes."""
    text = json.dumps(to_trace_events(cap, points=points), separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return len(text)
