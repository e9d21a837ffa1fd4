"""Reading PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`)
into capture files, without ever running code from the file.

A snapshot is a pickle, and unpickling can call any importable function.
_PlainData refuses every global (the only way a pickle reaches code), so
the file can build only dicts, lists, tuples, strings, numbers and bytes;
anything else fails with SnapshotError before a single object is called.

What a snapshot holds: `segments` (the allocator's state when it was
dumped, blocks with their state and allocation stack), `device_traces` (per
device, the last `max_entries` allocator actions: alloc, free_requested,
free_completed, segment_alloc/free/map/unmap, oom, snapshot), and
`allocator_settings`. The import writes those actions as events, the
state as the end baseline, and a start baseline rebuilt by undoing the
trace from the end state (docs/format.md, "Imported snapshots").
Snapshots written by `allocscope export --format memory-viz` carry the
capture's own events in extra keys and import back exactly.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

from ..allocator.config import divisions_list
from ..allocator.sizes import round_size
from ..capture import format as F
from ..capture.writer import CaptureWriter
from ..common.errors import InputError
from .memory_viz import EXTENSION

__all__ = ["SnapshotError", "convert_snapshot", "import_snapshot", "read_snapshot", "restore"]

K = F.EventKind
ACTIONS = {"alloc": K.ALLOC, "free_requested": K.FREE, "free_completed": K.FREE_COMPLETED,
           "segment_alloc": K.SEGMENT_ALLOC, "segment_free": K.SEGMENT_FREE, "segment_map": K.SEGMENT_MAP,
           "segment_unmap": K.SEGMENT_UNMAP, "oom": K.OOM, "snapshot": K.SNAPSHOT}
MAX_SNAPSHOT_BYTES = 8 << 30


class SnapshotError(InputError):
    """The file is not a PyTorch memory snapshot we can read safely."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(f"the pickle asks for {module}.{name}: a memory snapshot holds only plain data, "
                            "so this file was not made by torch.cuda.memory._dump_snapshot (refused, nothing run)")

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError("the pickle refers to persistent objects: not a memory snapshot (refused)")


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot dict of a `_dump_snapshot` file, read as plain data only."""
    size = os.path.getsize(path)
    if size > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"{path}: {size} bytes is larger than any snapshot this reader accepts")
    with open(path, "rb") as f:
        data = f.read()
    try:
        snap = _PlainData(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            MemoryError, RecursionError, UnicodeDecodeError, OverflowError) as e:
        raise SnapshotError(f"{path}: not a readable pickle ({type(e).__name__}: {e})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list) \
            or not isinstance(snap.get("device_traces", []), list):
        raise SnapshotError(f"{path}: a pickle, but not a PyTorch memory snapshot (no 'segments' list)")
    return snap


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise SnapshotError(f"a malformed snapshot: {what} is not an integer: {x!r:.60}")
    return x


def _stack(b: CaptureWriter, frames: Any) -> int:
    if not frames:
        return 0
    try:
        return b.stack([(str(f["filename"]), str(f["name"]), int(f["line"])) for f in frames[:128]])
    except (KeyError, TypeError, ValueError):
        raise SnapshotError("a trace entry's frames are not {filename, line, name} records") from None


def _segment(seg: dict[str, Any]) -> dict[str, Any]:
    """A snapshot segment as a BASELINE segment (docs/format.md)."""
    blocks = []
    for blk in seg["blocks"]:
        state = blk.get("state", "inactive")
        blocks.append([_int(blk["size"], "block size"), int(blk.get("requested_size", 0) or 0) if state != "inactive"
                       else 0, state == "active_allocated", state != "inactive"])
    return {"device": int(seg.get("device", 0)), "address": _int(seg["address"], "segment address"),
            "total_size": _int(seg["total_size"], "segment size"), "stream": int(seg.get("stream", 0)),
            "is_large": seg.get("segment_type", "large") == "large", "is_expandable": bool(seg.get("is_expandable")),
            "pool": list(seg.get("segment_pool_id") or (0, 0)),
            "requested_size": sum(b[1] for b in blocks), "allocated_size": sum(b[0] for b in blocks if b[2]),
            "active_size": sum(b[0] for b in blocks if b[3]), "blocks": blocks}


def _config(settings: dict[str, Any]) -> dict[str, Any]:
    conf = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or settings.get("PYTORCH_ALLOC_CONF") or "")
    out: dict[str, Any] = {"last_allocator_settings": conf}
    for key in ("max_split_size", "garbage_collection_threshold", "expandable_segments", "roundup_power2_divisions"):
        if key in settings:
            out[key] = settings[key]
    if isinstance(out.get("max_split_size"), int) and out["max_split_size"] < 0:
        out["max_split_size"] = (1 << 64) - 1  # torch reports "no limit" as -1 here
    if "roundup_power2_divisions" in out:  # a baseline keeps a list in interval order
        table = divisions_list(out.pop("roundup_power2_divisions"))
        if table is not None:
            out["roundup_power2_divisions"] = table
    return out


def _start_segments(end: list[dict[str, Any]], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The allocator's state before the trace: the end state with the
    trace undone. Segments made in the trace go, segments freed in it come
    back whole; blocks allocated before the trace (freed in it, or still
    live at the end and not allocated in it) are allocated at the start;
    the rest of each segment is free."""
    made = {e["addr"] for e in entries if e["action"] == "segment_alloc"}
    allocated_in_trace: set[int] = set()
    live_before: dict[int, tuple[int, int]] = {}  # addr -> (block size, requested)
    for e in entries:
        a = e.get("addr")
        if e["action"] == "alloc":
            allocated_in_trace.add(a)
        elif e["action"] == "free_requested" and a not in allocated_in_trace and a not in live_before:
            live_before[a] = (round_size(int(e["size"])), int(e["size"]))
    segs = [s for s in end if s["address"] not in made]
    for e in entries:
        if e["action"] == "segment_free" and e["addr"] not in made:
            segs.append({"device": int(e.get("device", 0)), "address": e["addr"], "total_size": e["size"],
                         "stream": int(e.get("stream", 0)), "is_large": e["size"] != 2 << 20, "is_expandable": False,
                         "pool": [0, 0], "blocks": [[e["size"], 0, False, False]]})
    out = []
    for s in segs:
        pos, blocks = s["address"], []
        live = dict(live_before)
        a = s["address"]
        for size, req, allocated, _active in s["blocks"]:
            if allocated and a not in allocated_in_trace:
                live[a] = (size, req)
            a += size
        for addr in sorted(x for x in live if s["address"] <= x < s["address"] + s["total_size"]):
            size, req = live[addr]
            if addr > pos:
                blocks.append([addr - pos, 0, False, False])
            blocks.append([size, req, True, True])
            pos = addr + size
        end_of = s["address"] + s["total_size"]
        if pos < end_of:
            blocks.append([end_of - pos, 0, False, False])
        out.append(s | {"blocks": blocks, "requested_size": sum(b[1] for b in blocks),
                        "allocated_size": sum(b[0] for b in blocks if b[2]),
                        "active_size": sum(b[0] for b in blocks if b[3])})
    return sorted(out, key=lambda s: s["address"])


def convert_snapshot(snap: dict[str, Any], *, source: str = "") -> CaptureWriter:
    """A snapshot dict as a capture (a CaptureWriter to write)."""
    ext = snap.get(EXTENSION)
    if isinstance(ext, dict) and ext.get("version") == 1:
        return restore(snap, ext)  # our own export: the capture comes back exactly
    try:
        return _convert(snap, source)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        if isinstance(e, SnapshotError):
            raise
        raise SnapshotError(f"a malformed snapshot: a segment, block or trace entry lacks a field or has one of "
                            f"the wrong type ({type(e).__name__}: {e})") from None


def _convert(snap: dict[str, Any], source: str) -> CaptureWriter:
    traces = snap.get("device_traces") or []
    b = CaptureWriter({"imported_from": source, "source": "PyTorch memory snapshot",
                        "torch": None, "devices_recorded": ["cuda"]}, device=0)
    entries: list[tuple[int, int, int, dict[str, Any]]] = []
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise SnapshotError("device_traces must be lists of trace entries")
        for k, e in enumerate(trace):
            if not isinstance(e, dict) or "action" not in e:
                raise SnapshotError("a trace entry is not a dict with an 'action'")
            entries.append((int(e.get("time_us", 0) or 0), d, k, e | {"device": d}))
    entries.sort(key=lambda x: (x[0], x[1], x[2]))
    end = [_segment(s) for s in snap["segments"]]
    plain = [e for _, _, _, e in entries]
    settings = snap.get("allocator_settings") if isinstance(snap.get("allocator_settings"), dict) else {}
    config = _config(settings)
    start = _start_segments(end, plain)
    t0 = entries[0][0] if entries else 0
    b.baseline({"label": "start", "device_type": "cuda", "seq": 0, "segments": start, "config": config,
                "reconstructed": "the end state with the trace undone"})
    skipped = 0
    pending: dict[int, int] = {}  # addr -> index of a free_requested not yet completed
    for t_us, d, _, e in entries:
        kind = ACTIONS.get(e["action"])
        if kind is None:
            skipped += 1
            continue
        stream = b.stream(d, int(e.get("stream", 0) or 0))
        dt = max(0, (t_us - t0) * 1000 + 1_000_000 - b.time_ns)
        addr = _int(e.get("addr", 0) or 0, "addr")
        size = _int(e.get("size", 0) or 0, "size")
        stack = _stack(b, e.get("frames"))
        if kind == K.FREE:
            # Like the recorder: a FREE; a FREE_COMPLETED only where the block
            # stayed busy on another stream (its free_completed comes later).
            pending[addr] = b.event(K.FREE, addr=addr, size=0, stack=stack, stream=F.NO_STREAM, dt=dt)
        elif kind == K.FREE_COMPLETED:
            i = pending.pop(addr, None)
            if i is None or i != b.n_events - 1:
                b.event(K.FREE_COMPLETED, addr=addr, size=size, stream=stream, dt=dt)
        elif kind == K.OOM:
            b.event(K.OOM, size=size, block=round_size(size), stack=stack, arg=int(e.get("device_free", 0) or 0),
                    stream=stream, dt=dt)
        else:
            b.event(kind, addr=addr, size=size, stack=stack, stream=stream, dt=dt)
    b.baseline({"label": "end", "device_type": "cuda", "seq": b.n_events, "segments": end, "config": config})
    if skipped:
        b.metadata["import_warnings"] = [f"{skipped} trace entries of kinds allocscope does not record were skipped"]
    return b


def import_snapshot(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a `_dump_snapshot` pickle and writes it as a capture; returns counts."""
    b = convert_snapshot(read_snapshot(path), source=os.fspath(path))
    b.write(out)
    return {"events": b.n_events, "stacks": len(b.nodes) - 1, "path": os.fspath(out)}


def restore(snap: dict[str, Any], ext: dict[str, Any]) -> CaptureWriter:
    """The capture an export (memory_viz.py) came from, from its EXTENSION fields."""
    try:
        b = CaptureWriter(dict(ext["metadata"]))
        b.metadata = dict(ext["metadata"])
        b.threads = [(int(t), str(name)) for t, name in ext["threads"]]
        b.streams = [(int(d), int(h)) for d, h in ext["streams"]]
        b.set_strings([str(text) for text in ext["strings"]])  # the same ids: marks and annotations keep their args
        rows: list[tuple[int, ...]] = []
        for trace in snap["device_traces"]:
            for e in trace:
                own = e.get(EXTENSION)
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
