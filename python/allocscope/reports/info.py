"""The `allocscope info` document: what a capture holds (metadata, event
counts, sizes, bytes live at the end and at the peak, the baselines), and
its text rendering."""

from __future__ import annotations

import datetime
import os
import shlex
from typing import Any

import numpy as np

from ..attribution.lifetimes import lifetimes, live_bytes
from ..capture.reader import Capture
from ..common.units import format_bytes

__all__ = ["render", "summarize"]


def summarize(cap: Capture) -> dict[str, Any]:
    """What `allocscope info --json` prints about a capture."""
    path = cap.path
    ev = cap.events
    lt = lifetimes(ev)
    live = live_bytes(ev, lt)
    peak_i = int(np.argmax(live)) if len(live) else -1
    size = os.path.getsize(path)
    md = cap.metadata
    return {
        "file": path,
        "format_version": cap.version,
        "complete": cap.complete,
        "stop_reason": (cap.footer or {}).get("reason"),
        "warnings": cap.warnings,
        "metadata": md,
        "duration_s": cap.duration_ns / 1e9,
        "events": {"total": len(ev), **ev.counts()},
        "stacks": max(len(cap.stack_parent) - 1, 0),
        "frames": len(cap.frame_file),
        "threads": len(cap.threads) - 1 if cap.threads else 0,
        "file_bytes": size,
        "bytes_per_event": size / len(ev) if len(ev) else None,
        "event_bytes_per_event": cap.chunk_bytes.get("events", 0) / len(ev) if len(ev) else None,
        "chunk_bytes": cap.chunk_bytes,
        "live_at_end": {"bytes": int(live[-1]) if len(live) else 0, "allocations": int(len(lt.live_at_end))},
        "peak_live": {"bytes": int(live[peak_i]) if peak_i >= 0 else 0,
                      "at_s": (int(ev.time_ns[peak_i]) - int(ev.time_ns[0])) / 1e9 if peak_i >= 0 else None},
        "frees_of_older_memory": int(len(lt.unmatched_frees)),
        "baselines": [_baseline_summary(b) for b in cap.baselines],
    }


def _baseline_summary(b: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"label": b.get("label"), "device_type": b.get("device_type")}
    if b.get("device_type") == "cuda":
        out["segments"] = len(b.get("segments", []))
        out["reserved_bytes"] = sum(s.get("total_size", 0) for s in b.get("segments", []))
        out["allocated_bytes"] = sum(s.get("allocated_size", 0) for s in b.get("segments", []))
        out["devices"] = [{k: d[k] for k in ("index", "used", "total", "virtual") if k in d}
                          for d in b.get("devices", [])]
    elif "rss_bytes" in b:
        out["rss_bytes"] = b["rss_bytes"]
    return out


def _card_detail(d: dict[str, Any]) -> str:
    """On the virtual GPU: NCCL's buffers and other processes on the card."""
    v = d.get("virtual")
    if not isinstance(v, dict):
        return ""
    parts = []
    if v.get("nccl_peak"):
        parts.append(f"NCCL {format_bytes(int(v['nccl']))}" + (f", {format_bytes(int(v['nccl_peak']))} at its most"
                                                                if v["nccl_peak"] > v.get("nccl", 0) else ""))
    if v.get("other_processes"):
        parts.append(f"other processes {format_bytes(int(v['other_processes']))}")
    return f" ({', '.join(parts)})" if parts else ""


def render(s: dict[str, Any]) -> str:
    """The info document as text."""
    fb = format_bytes
    md = s["metadata"]
    lines = [f"allocscope capture {s['file']} (format {s['format_version']}, "
             f"{'complete' if s['complete'] else 'INCOMPLETE: the recording did not stop cleanly'})"]
    if md.get("start_unix_ns"):
        when = datetime.datetime.fromtimestamp(md["start_unix_ns"] / 1e9, datetime.timezone.utc)
        lines.append(f"  recorded   {when:%Y-%m-%d %H:%M:%S} UTC for {s['duration_s']:.3f} s, "
                     f"pid {md.get('pid')} on {md.get('host')}")
    if md.get("argv"):
        lines.append(f"  command    {shlex.join(md['argv'])}")
    if md.get("torch"):
        lines.append(f"  torch      {md['torch']} (CUDA {md.get('torch_cuda')}), Python {md.get('python')}")
    devices = ", ".join(md.get("devices_recorded", []))
    for d in md.get("cuda_devices", []):
        devices += f"; cuda:{d['index']} {d['name']} ({fb(d['total_memory'])})"
    lines.append(f"  devices    {devices}")
    virtual = md.get("virtual_gpu")
    if virtual:
        lines.append(f"  virtual    {virtual.get('spec')}: allocscope's virtual GPU (torch's real caching allocator, "
                     f"kernels computing nothing; CUDA context {fb(virtual['devices'][0]['context_bytes'])})")
    conf = (md.get("alloc_conf") or {}).get("raw")
    if md.get("allocator_backend") or conf:
        lines.append(f"  allocator  {md.get('allocator_backend', '?')}" + (f", PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else ""))
    walker = (md.get("recorder") or {}).get("stack_walker", "?")
    lines.append(f"  stacks     {md.get('stacks', '?')} ({walker}); {s['stacks']:,} distinct stacks, {s['frames']:,} frames")
    counts = ", ".join(f"{k} {v:,}" for k, v in s["events"].items() if k != "total")
    lines.append(f"  events     {s['events']['total']:,} ({counts})")
    bpe = (f", {s['bytes_per_event']:.1f} bytes/event ({s['event_bytes_per_event']:.1f} in events, "
           f"the rest stacks, tables and baselines)") if s["bytes_per_event"] else ""
    lines.append(f"  file       {fb(s['file_bytes'])}{bpe}")
    lines.append(f"  live       at end {fb(s['live_at_end']['bytes'])} in {s['live_at_end']['allocations']:,} allocations; "
                 f"peak {fb(s['peak_live']['bytes'])}" + (f" at {s['peak_live']['at_s']:.3f} s" if s['peak_live']['at_s'] is not None else "")
                 + " (requested bytes allocated while recording)")
    for b in s["baselines"]:
        if b["device_type"] == "cuda":
            used = "; ".join(f"cuda:{d['index']} device used {fb(d['used'])} of {fb(d['total'])}{_card_detail(d)}"
                             for d in b["devices"] if "used" in d)
            lines.append(f"  baseline   {b['label']}: reserved {fb(b['reserved_bytes'])} in {b['segments']} segments, "
                         f"allocated {fb(b['allocated_bytes'])}" + (f"; {used}" if used else ""))
        elif b.get("rss_bytes"):
            lines.append(f"  baseline   {b['label']}: process RSS {fb(b['rss_bytes'])}")
    for w in s["warnings"]:
        lines.append(f"  warning    {w}")
    return "\n".join(lines)
