"""Writing a capture as a PyTorch memory snapshot, the pickle that
pytorch.org/memory_viz and `torch.cuda._memory_viz` open.

The snapshot holds what torch's own would: the allocator's segments at the
end (from the end baseline, each live block with the stack that allocated
it), one trace per device (alloc, free_requested + free_completed,
segment_*, oom, snapshot), and the allocator settings. memory_viz reads only
those. Everything else of the capture rides along in extra keys it
ignores: per trace entry `allocscope` = [seq, kind byte, time_ns, thread,
block, arg, device, stream, size], and a top-level `allocscope` with the
metadata, baselines, threads, streams, strings and the events no trace
action holds (marks, annotations, empty_cache, set_fraction), so
`allocscope import` restores every event column exactly.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

from .. import _format as F
from .._synthetic import CaptureBuilder
from ..analysis.lifetimes import lifetimes
from ..analysis.replay import deferred_frees
from ..reader import Capture, StreamInfo

__all__ = ["export_memory_viz", "restore", "to_snapshot"]

K = F.EventKind
_TRACE_ACTION = {K.ALLOC: "alloc", K.FREE: "free_requested", K.FREE_COMPLETED: "free_completed",
                 K.SEGMENT_ALLOC: "segment_alloc", K.SEGMENT_FREE: "segment_free", K.SEGMENT_MAP: "segment_map",
                 K.SEGMENT_UNMAP: "segment_unmap", K.OOM: "oom", K.SNAPSHOT: "snapshot"}


def _frames(cap: Capture, stack: int, cache: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    if stack not in cache:
        cache[stack] = [{"filename": f.filename, "line": f.line, "name": f.function} for f in cap.stack(stack)]
    return cache[stack]


def to_snapshot(cap: Capture) -> dict[str, Any]:
    ev = cap.events
    n = len(ev)
    lt = lifetimes(ev)
    alloc_of_free = np.full(n, -1, np.int64)
    freed = lt.free >= 0
    alloc_of_free[lt.free[freed]] = lt.alloc[freed]
    deferred = deferred_frees(cap)
    frames: dict[int, list[dict[str, Any]]] = {}
    n_dev = max([s.device for s in cap.streams if s.device >= 0] + [0]) + 1
    traces: list[list[dict[str, Any]]] = [[] for _ in range(n_dev)]
    extras = []
    raw_kind = ev.kind.astype(np.int64) | np.where(ev.via_allocator, F.VIA_ALLOCATOR, 0)
    cols = zip(range(n), ev.kind.tolist(), raw_kind.tolist(), ev.time_ns.tolist(), ev.thread.tolist(),
               ev.stream.tolist(), ev.addr.tolist(), ev.size.tolist(), ev.block.tolist(), ev.stack.tolist(),
               ev.arg.tolist(), strict=True)
    for i, k, raw, t, th, st, addr, size, block, stack, arg in cols:
        stream = cap.streams[st] if st < len(cap.streams) else StreamInfo(-2, 0)
        action = _TRACE_ACTION.get(k)
        if action is None:
            extras.append([i, raw, t, th, stream.device, stream.handle, addr, size, block,
                           _frames(cap, stack, frames) if stack else [], arg])
            continue
        own = [i, raw, t, th, block, arg, stream.device, stream.handle, size]
        size_out, handle = size, stream.handle
        if k == K.FREE and alloc_of_free[i] >= 0:
            # torch's free entries carry the block's size and stream (the recorder's FREE, its ALLOC's)
            j = int(alloc_of_free[i])
            size_out, handle = int(ev.size[j]), cap.streams[int(ev.stream[j])].handle
            stream = cap.streams[int(ev.stream[j])]
        dev = max(stream.device, 0)
        entry: dict[str, Any] = {"action": action, "addr": addr, "size": size_out, "stream": handle,
                                 "time_us": t // 1000, "frames": _frames(cap, stack, frames) if stack else [],
                                 "allocscope": own}
        if k == K.OOM:
            entry["device_free"] = arg
            entry["size"] = size or block
        traces[dev].append(entry)
        if k == K.FREE and not deferred[i]:
            traces[dev].append(entry | {"action": "free_completed", "frames": [], "allocscope": None})
    # The end state, each live block with the stack that allocated it.
    end = cap.baseline("end") or {}
    last_alloc: dict[int, int] = {}
    for i in lt.alloc.tolist():
        last_alloc[int(ev.addr[i])] = i
    segments = []
    for s in end.get("segments") or ():
        blocks, a = [], int(s["address"])
        for size, req, allocated, active in s["blocks"]:
            state = "active_allocated" if allocated else "active_pending_free" if active else "inactive"
            i = last_alloc.get(a)
            blocks.append({"address": a, "size": int(size), "requested_size": int(req), "state": state,
                           "frames": _frames(cap, int(ev.stack[i]), frames) if allocated and i is not None else []})
            a += int(size)
        segments.append({"device": int(s.get("device", 0)), "address": int(s["address"]),
                         "total_size": int(s["total_size"]), "stream": int(s.get("stream", 0)),
                         "segment_type": "large" if s.get("is_large", True) else "small",
                         "segment_pool_id": tuple(s.get("pool") or (0, 0)),
                         "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                         "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                         "requested_size": sum(b["requested_size"] for b in blocks), "is_expandable":
                             bool(s.get("is_expandable")), "blocks": blocks})
    config = end.get("config") or (cap.baseline("start") or {}).get("config") or {}
    settings = {"PYTORCH_CUDA_ALLOC_CONF": config.get("last_allocator_settings", "")}
    for key in ("max_split_size", "garbage_collection_threshold", "expandable_segments", "roundup_power2_divisions"):
        if key in config:
            settings[key] = config[key]
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings,
            "allocscope": {"version": 1, "metadata": cap.metadata, "baselines": cap.baselines,
                           "threads": [[t.native_id, t.name] for t in cap.threads],
                           "streams": [[s.device, s.handle] for s in cap.streams], "strings": cap.strings,
                           "events": n, "extras": extras}}


def export_memory_viz(cap: Capture, path: str | os.PathLike[str]) -> int:
    """Writes the snapshot pickle; returns its size in bytes."""
    data = pickle.dumps(to_snapshot(cap), protocol=4)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def restore(snap: dict[str, Any], ext: dict[str, Any]) -> CaptureBuilder:
    """The capture an export came from (see the module docstring)."""
    from .snapshot import SnapshotError

    try:
        b = CaptureBuilder(dict(ext["metadata"]))
        b.metadata = dict(ext["metadata"])
        b.threads = [(int(t), str(name)) for t, name in ext["threads"]]
        b.streams = [(int(d), int(h)) for d, h in ext["streams"]]
        b.strings = [str(text) for text in ext["strings"]]  # the same ids: marks and annotations keep their args
        for j, text in enumerate(b.strings):
            b._string_ids.setdefault(text, j)
        rows: list[tuple[int, ...]] = []
        for trace in snap["device_traces"]:
            for e in trace:
                own = e.get("allocscope")
                if own is None:
                    continue  # a free_completed the export added
                i, raw, t, th, block, arg, dev, handle, size = own
                rows.append((i, raw, t, th, b.stream(dev, handle), int(e.get("addr", 0)), size, block, b.stack(
                    [(f["filename"], f["name"], f["line"]) for f in e["frames"]]), arg))
        for i, raw, t, th, dev, handle, addr, size, block, frames, arg in ext["extras"]:
            stream = b.stream(dev, handle)
            rows.append((i, raw, t, th, stream, addr, size, block,
                         b.stack([(f["filename"], f["name"], f["line"]) for f in frames]), arg))
    except (KeyError, TypeError, ValueError) as e:
        raise SnapshotError(f"the allocscope fields of this snapshot are damaged ({type(e).__name__}: {e})") from None
    rows.sort()
    if [r[0] for r in rows] != list(range(int(ext["events"]))):
        raise SnapshotError("the allocscope fields of this snapshot do not hold every event")
    b.events = [(raw, t, th, st, addr, size, block, stack, arg) for _, raw, t, th, st, addr, size, block, stack, arg
                in rows]
    b.baselines = list(ext["baselines"])
    return b
