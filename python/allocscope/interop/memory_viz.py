"""Writing a capture as a PyTorch memory snapshot, the pickle that
pytorch.org/memory_viz and `torch.cuda._memory_viz` open.

The snapshot holds what torch's own would: the allocator's segments at the
end (from the end baseline, each live block with the stack that allocated
it), one trace per device (alloc, free_requested + free_completed,
segment_*, oom, snapshot), and the allocator settings. memory_viz reads only
those. Everything else of the capture rides along in extra keys it
ignores (EXTENSION): per trace entry `allocscope` = [seq, kind byte, time_ns, thread,
block, arg, device, stream, size], and a top-level `allocscope` with the
metadata, baselines, threads, streams, strings and the events no trace
action holds (marks, annotations, empty_cache, set_fraction), so
`allocscope import` restores every event column exactly (snapshot.py).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

from ..allocator.recorded import deferred_frees
from ..allocator.segments import ALLOCATED, INACTIVE, PENDING_FREE, baseline_segments
from ..attribution.lifetimes import lifetimes
from ..capture import format as F
from ..capture.reader import Capture, StreamInfo

__all__ = ["EXTENSION", "export_memory_viz", "to_snapshot"]

EXTENSION = "allocscope"  # the key of our own fields in the snapshot (entries and top level)

K = F.EventKind
_TRACE_ACTION = {K.ALLOC: "alloc", K.FREE: "free_requested", K.FREE_COMPLETED: "free_completed",
                 K.SEGMENT_ALLOC: "segment_alloc", K.SEGMENT_FREE: "segment_free", K.SEGMENT_MAP: "segment_map",
                 K.SEGMENT_UNMAP: "segment_unmap", K.OOM: "oom", K.SNAPSHOT: "snapshot"}


# torch's names of block states (one string object each, as torch's pickles share them).
_SNAPSHOT_STATE = {ALLOCATED: "active_allocated", PENDING_FREE: "active_pending_free", INACTIVE: "inactive"}


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
                                 EXTENSION: own}
        if k == K.OOM:
            entry["device_free"] = arg
            entry["size"] = size or block
        traces[dev].append(entry)
        if k == K.FREE and not deferred[i]:
            traces[dev].append(entry | {"action": "free_completed", "frames": [], EXTENSION: None})
    # The end state, each live block with the stack that allocated it.
    end = cap.baseline("end") or {}
    last_alloc: dict[int, int] = {}
    for i in lt.alloc.tolist():
        last_alloc[int(ev.addr[i])] = i
    segments = []
    for s in baseline_segments(end):
        blocks = []
        for blk in s.blocks:
            state = _SNAPSHOT_STATE[blk.state]
            i = last_alloc.get(blk.address)
            blocks.append({"address": blk.address, "size": blk.size, "requested_size": blk.requested, "state": state,
                           "frames": _frames(cap, int(ev.stack[i]), frames) if blk.allocated and i is not None else []})
        segments.append({"device": s.device, "address": s.address, "total_size": s.total_size, "stream": s.stream,
                         "segment_type": s.pool_kind, "segment_pool_id": s.pool,
                         "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                         "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                         "requested_size": sum(b["requested_size"] for b in blocks), "is_expandable": s.is_expandable,
                         "blocks": blocks})
    config = end.get("config") or (cap.baseline("start") or {}).get("config") or {}
    settings = {"PYTORCH_CUDA_ALLOC_CONF": config.get("last_allocator_settings", "")}
    for key in ("max_split_size", "garbage_collection_threshold", "expandable_segments", "roundup_power2_divisions"):
        if key in config:
            settings[key] = config[key]
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings,
            EXTENSION: {"version": 1, "metadata": cap.metadata, "baselines": cap.baselines,
                           "threads": [[t.native_id, t.name] for t in cap.threads],
                           "streams": [[s.device, s.handle] for s in cap.streams], "strings": cap.strings,
                           "events": n, "extras": extras}}


def export_memory_viz(cap: Capture, path: str | os.PathLike[str]) -> int:
    """Writes the snapshot pickle; returns its size in bytes."""
    data = pickle.dumps(to_snapshot(cap), protocol=4)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)
