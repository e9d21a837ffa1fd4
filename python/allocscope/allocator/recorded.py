"""What a CUDA capture recorded of the caching allocator, as the replay
reads it: the bytes it held after each event (recorded_reserved), the frees
that waited for another stream (deferred_frees), the request behind a
segment event (request_at), exact memory fractions (recorded_fraction), and
the check of a replay's segment events against the recorded ones
(SegmentChecker, summed up in Fidelity).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np

from ..capture.format import EventKind
from ..capture.reader import Capture
from ..common.native import analysis_for
from .blocks import SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, BumpAddresses, SegmentEvent
from .config import AllocatorConfig, recorded_config
from ..capture.baselines import baseline_reserved
from .segments import baseline_segments, pending_blocks

__all__ = ["KIND_NAMES", "Fidelity", "SegmentChecker", "bypassed_cache", "deferred_frees", "end_snapshot_events",
           "end_to_compare", "end_window", "recorded_fraction", "recorded_reserved", "request_at",
           "settle_end_snapshot"]

KIND_NAMES = {int(EventKind.SEGMENT_ALLOC): SEGMENT_ALLOC, int(EventKind.SEGMENT_FREE): SEGMENT_FREE,
               int(EventKind.SEGMENT_MAP): SEGMENT_MAP, int(EventKind.SEGMENT_UNMAP): SEGMENT_UNMAP}


@dataclasses.dataclass
class Fidelity:
    """How closely a replay with the recorded settings followed the recording."""

    recorded_segment_events: int
    simulated_segment_events: int
    matched: int  # leading segment events that agree in kind, address and size
    first_mismatch: dict[str, Any] | None
    allocations: int
    address_mismatches: int  # blocks handed out at another address than recorded
    end_snapshot: dict[str, Any] | None  # compare_snapshot() with the end baseline (None: not compared)
    checked_until: int = -1  # the last event replayed (replay(stop_after=...) stops early)

    @property
    def exact(self) -> bool:
        snap_ok = self.end_snapshot is None or self.end_snapshot["equal"]
        return (self.first_mismatch is None and self.matched == self.recorded_segment_events
                and self.address_mismatches == 0 and snap_ok)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"exact": self.exact}


def deferred_frees(cap: Capture, *, engine: str = "auto") -> np.ndarray:
    """Per event: a FREE whose block stayed busy until a later FREE_COMPLETED,
    or until the end of the recording (the end baseline shows it pending).
    engine: "native" (C++, allocscope._analysis: one pass with a hash map),
    "numpy" (the reference, by a sort) or "auto" (native where built and the
    events are in sequence order)."""
    ev = cap.events
    pending_at_end = pending_blocks(cap.baseline("end"))
    fast = analysis_for(engine, "numpy")
    if fast is not None and (engine == "native" or ev.in_sequence_order()):
        out = fast.deferred_frees(np.ascontiguousarray(ev.kind, np.uint8), np.ascontiguousarray(ev.addr, np.uint64),
                                  [int(a) for a in pending_at_end])
        return out.astype(bool)
    k = ev.kind
    idx = np.flatnonzero((k == EventKind.ALLOC) | (k == EventKind.FREE) | (k == EventKind.FREE_COMPLETED))
    order = idx[np.lexsort((ev.seq[idx], ev.addr[idx]))]
    out = np.zeros(len(ev), bool)
    if len(order) > 1:
        a, kk = ev.addr[order], k[order]
        hit = (kk[:-1] == EventKind.FREE) & (kk[1:] == EventKind.FREE_COMPLETED) & (a[:-1] == a[1:])
        out[order[:-1][hit]] = True
    if len(order) and pending_at_end:
        # the last event at each address: a FREE of a block still pending at the end
        last = np.append(ev.addr[order][1:] != ev.addr[order][:-1], True)
        tail = order[last & (k[order] == EventKind.FREE)]
        out[tail[np.isin(ev.addr[tail], np.fromiter(pending_at_end, np.uint64, len(pending_at_end)))]] = True
    return out


def bypassed_cache(cap: Capture) -> np.ndarray:
    """Per event: an ALLOC that c10 served past its cache (its uncached path:
    `caching_allocator_enable(False)`, PYTORCH_NO_CUDA_MEMORY_CACHING; a
    cudaMalloc of its own, in no segment: the recorder gives its ALLOC a
    block, docs/format.md), and the FREE of it. A replay serves neither."""
    ev = cap.events
    k = ev.kind
    out = (k == EventKind.ALLOC) & (ev.block != 0)
    if not out.any():
        return out
    # At each of their addresses, in sequence order: the FREE right after such an ALLOC is its own.
    near = np.flatnonzero(((k == EventKind.ALLOC) | (k == EventKind.FREE)) & np.isin(ev.addr, ev.addr[out]))
    order = near[np.lexsort((ev.seq[near], ev.addr[near]))]
    pair = (ev.addr[order][1:] == ev.addr[order][:-1]) & out[order][:-1] & (k[order][1:] == EventKind.FREE)
    out[order[1:][pair]] = True
    return out


class SegmentChecker:
    """Compares a device's segment events with the recorded ones as they
    happen, and tells the model the recorded address of each new segment."""

    def __init__(self, recorded: list[tuple[int, str, int, int]], enabled: bool, synthetic: BumpAddresses):
        self.recorded = recorded  # (event index, kind, addr, size)
        self.enabled = enabled
        self.j = 0
        self.first_mismatch: dict[str, Any] | None = None
        self.synthetic = synthetic

    def address(self, kind: str, size: int) -> int:
        if self.enabled and self.first_mismatch is None and self.j < len(self.recorded):
            _, rkind, raddr, rsize = self.recorded[self.j]
            if rkind == kind and (kind != SEGMENT_ALLOC or rsize == size):
                return raddr
        return self.synthetic(kind, size)

    def upcoming_frees(self, n: int) -> list[int]:
        """The addresses of the next recorded segment frees, up to n, while
        the replay still follows the recording (else none)."""
        if not self.enabled or self.first_mismatch is not None:
            return []
        out = []
        for _, kind, addr, _ in self.recorded[self.j:]:
            if kind != SEGMENT_FREE or len(out) == n:
                break
            out.append(addr)
        return out

    def check(self, e: SegmentEvent) -> None:
        if not self.enabled or self.first_mismatch is not None:
            return
        if self.j < len(self.recorded):
            ri, rkind, raddr, rsize = self.recorded[self.j]
            if (rkind, raddr, rsize) == (e.kind, e.addr, e.size):
                self.j += 1
                return
            rec = {"event": ri, "kind": rkind, "addr": raddr, "size": rsize}
        else:
            rec = None
        self.first_mismatch = {"position": self.j, "recorded": rec,
                               "simulated": {"event": e.request, "kind": e.kind, "addr": e.addr, "size": e.size}}


def recorded_fraction(arg: int, block: int) -> float:
    """A SET_FRACTION event's fraction: exact from its bits (block), or to 9
    digits from arg (files written before the bits were recorded)."""
    return struct.unpack("<d", struct.pack("<Q", block))[0] if block else arg / 1e9


def recorded_reserved(cap: Capture, device: int | None = None) -> np.ndarray:
    """Bytes the caching allocator held after each event (index e + 1; 0 is
    the start), from the start baseline and the recorded segment events."""
    ev = cap.events
    grows = (ev.kind == EventKind.SEGMENT_ALLOC) | (ev.kind == EventKind.SEGMENT_MAP)
    at = np.flatnonzero(grows | (ev.kind == EventKind.SEGMENT_FREE) | (ev.kind == EventKind.SEGMENT_UNMAP))
    if device is not None:
        stream_dev = np.array([s.device for s in cap.streams] or [-2], np.int64)
        at = at[stream_dev[ev.stream[at]] == device]
    delta = np.zeros(len(ev), np.int64)  # (segment events are few: the sizes of the others are not read)
    delta[at] = np.where(grows[at], 1, -1) * ev.size[at].astype(np.int64)
    out = np.empty(len(ev) + 1, np.int64)
    out[0] = baseline_reserved(cap.baseline("start"), device)
    np.cumsum(delta, out=out[1:])
    out[1:] += out[0]
    return out


def request_at(cap: Capture, e: int) -> int:
    """The event whose replay produced event e: a recorded segment event
    belongs to the allocation (or OOM) after it; any other event to itself."""
    ev = cap.events
    if e < 0 or not (EventKind.SEGMENT_ALLOC <= int(ev.kind[e]) <= EventKind.SEGMENT_UNMAP):
        return e
    later = np.flatnonzero((ev.kind[e:] == EventKind.ALLOC) | (ev.kind[e:] == EventKind.OOM))
    return e + int(later[0]) if len(later) else e


# The end baseline's snapshot is taken while other threads may still
# allocate and free (the autograd engine's thread finishing a backward when
# a time limit ends the process, say). Each device's part of it was read
# under that device's lock, where its SNAPSHOT event stands in the stream:
# the baseline names those events (`snapshot_events`), and the replay's
# state after each is what that device's part must equal. Captures made
# before say only the baseline's `seq`, the event count when it began: the
# snapshot then equals the replay's state after one of the last events.
END_WINDOW = 64


def end_snapshot_events(cap: Capture) -> dict[int, int]:
    """{device: the index of the SNAPSHOT event at which the end baseline
    read it}, from the baseline's `snapshot_events`; {} where it has none."""
    end = cap.baseline("end")
    marks = (end or {}).get("snapshot_events")
    if not marks:
        return {}
    seq = cap.events.seq
    out = {}
    for device, at in marks:
        found = np.flatnonzero(seq == at)
        if len(found) and cap.events.kind[found[0]] == EventKind.SNAPSHOT:
            out[int(device)] = int(found[0])
    return out if len(out) == len(marks) else {}


def end_window(cap: Capture) -> list[int]:
    """The events after which the end snapshot may have been taken: each
    device's SNAPSHOT event where the baseline names them, else the last
    few events but the last."""
    marked = end_snapshot_events(cap)
    if marked:
        return sorted(set(marked.values()))
    end = cap.baseline("end")
    n = len(cap.events)
    seq = end.get("seq") if end else None
    if not isinstance(seq, int) or not 0 < seq < n:
        return []
    window = set(range(max(seq - 1, n - 1 - END_WINDOW), n - 1))
    # (and the first SNAPSHOT event from its seq on: the baseline's own but
    # where another snapshot came in between)
    snapshots = np.flatnonzero((cap.events.kind == EventKind.SNAPSHOT) & (cap.events.seq >= seq))
    if len(snapshots) and snapshots[0] < n - 1:
        window.add(int(snapshots[0]))
    return sorted(window)


def end_to_compare(cap: Capture, until: int) -> dict[str, Any] | None:
    """The end baseline a replay that stopped after event `until` ends in,
    or None: not where it stopped early, nor where the capture was read only
    up to some step (load(through_step=...): its end baseline is the file's)."""
    if until != len(cap.events) - 1 or cap.read_until_step is not None:
        return None
    return cap.baseline("end")


def settle_end_snapshot(rep: Any, cap: Capture, window: list[int], asked: set[int]) -> Any:
    """rep (a replay.Replay), its end comparison settled: where the end
    snapshot differs from the replay's last state, each device's part
    against the state after its SNAPSHOT event (end_snapshot gets
    `at_events`), or in older captures the latest state of the window it
    equals, if any (end_snapshot gets `after_event`). Then the states of
    the window that were not asked for are dropped."""
    from .state import compare_snapshot  # state.py builds on the model, which this module must not need

    f = rep.fidelity
    if f is not None and f.end_snapshot is not None and not f.end_snapshot["equal"] and window:
        end = baseline_segments(cap.baseline("end"))
        marked = end_snapshot_events(cap)
        if marked and all(at in rep.states for at in marked.values()):
            parts = [compare_snapshot([s for s in rep.states[at] if s.device == device],
                                      [s for s in end if s.device == device]) for device, at in marked.items()]
            f.end_snapshot = {"equal": all(p["equal"] for p in parts), "segments": len(end),
                              "only_in_replay": [x for p in parts for x in p["only_in_replay"]][:5],
                              "only_in_snapshot": [x for p in parts for x in p["only_in_snapshot"]][:5],
                              "at_events": {str(d): at for d, at in marked.items()}}
        else:
            for at in reversed(window):
                same = compare_snapshot(rep.states[at], end) if at in rep.states else None
                if same is not None and same["equal"]:
                    f.end_snapshot = same | {"after_event": at}
                    break
    for at in window:
        if at not in asked:
            rep.states.pop(at, None)
    return rep


def device_info(base: dict[str, Any] | None, metadata: dict[str, Any],
                end: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """Per device what a replay bounds it by: total memory, free memory and
    what was reserved at the start, the memory fraction."""
    info: dict[int, dict[str, Any]] = {}
    for d in metadata.get("cuda_devices") or ():
        info[int(d["index"])] = {"total": int(d.get("total_memory") or 0)}
    for d in (base or {}).get("devices") or ():
        entry = info.setdefault(int(d["index"]), {})
        if "total" in d:
            entry["total"] = int(d["total"])
            entry["free"] = int(d["free"])
        stats = d.get("stats") or {}
        if "reserved_bytes" in stats:
            entry["reserved"] = int(stats["reserved_bytes"]["current"])
        if d.get("memory_fraction") is not None and float(d["memory_fraction"]) < 1.0:
            entry["fraction"] = float(d["memory_fraction"])
    # A device not read at the start (no context yet: the session reads none
    # then) had nothing reserved; what its allocator could have is what the
    # end found free plus what was reserved by then.
    for d in (end or {}).get("devices") or ():
        entry = info.setdefault(int(d["index"]), {})
        if "free" in entry or "free" not in d:
            continue
        reserved = int(((d.get("stats") or {}).get("reserved_bytes") or {}).get("current", 0))
        entry.update(total=int(d["total"]), free=int(d["free"]) + reserved, reserved=0)
    return info


def settings_changes(cap: Capture) -> list[tuple[int, AllocatorConfig]]:
    """Where the program changed the allocator's settings while recording
    (baselines labelled "settings", docs/format.md): (the index of the
    baseline's SNAPSHOT event, the first at or after its `seq`: the program's
    own snapshots make SNAPSHOT events too; the settings from there on), in
    order."""
    changes = [b for b in cap.baselines if b.get("device_type") == "cuda" and b.get("label") == "settings"
               and isinstance(b.get("seq"), int)]
    if not changes:
        return []
    snapshots = np.flatnonzero(cap.events.kind == EventKind.SNAPSHOT)
    # seq numbers the recorder's events (a second recording in a process
    # does not start at 0); past the last SNAPSHOT: in force after every event
    at = np.searchsorted(cap.events.seq[snapshots], [b["seq"] for b in changes])
    return [(int(snapshots[k]) if k < len(snapshots) else len(cap.events), recorded_config(b, cap.metadata))
            for k, b in zip(at.tolist(), changes, strict=True)]
