"""Replaying a CUDA capture through the caching-allocator model.

With the recorded settings (config=None) the replay reconstructs the
allocator's state at any event and checks itself against the recording: every
SEGMENT_ALLOC/FREE/MAP/UNMAP it makes must be the recorded one (kind, address,
size, in order), every block it hands out must be at the recorded address, and
its final state must equal the end baseline's snapshot. With other settings
(or a smaller card) it predicts what the same requests would have done.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import numpy as np

from .._format import EventKind
from ..reader import Capture
from .allocator_config import AllocatorConfig, recorded_config
from .allocator_state import load_segments, segments
from .simulator import (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, Block, DeviceAllocator,
                        SegmentEvent, BumpAddresses, free_block_order, round_size)

__all__ = ["Fidelity", "NotACudaCapture", "OomRecord", "Replay", "compare_snapshot", "deferred_frees",
           "recorded_reserved", "replay", "request_at"]

_KIND_NAMES = {int(EventKind.SEGMENT_ALLOC): SEGMENT_ALLOC, int(EventKind.SEGMENT_FREE): SEGMENT_FREE,
               int(EventKind.SEGMENT_MAP): SEGMENT_MAP, int(EventKind.SEGMENT_UNMAP): SEGMENT_UNMAP}


class NotACudaCapture(ValueError):
    """The capture recorded no CUDA allocator (a CPU recording)."""


@dataclasses.dataclass
class OomRecord:
    """An allocation the (simulated) allocator could not serve."""

    event: int  # capture event index of the request
    device: int
    size: int  # requested bytes
    rounded: int
    stream: int
    recorded: bool  # the recording failed here too
    reserved: int  # after release-and-retry, as torch reports it
    allocated: int
    active: int
    capacity: int | None
    allowed: int | None
    segments: list[dict[str, Any]]  # the allocator's state when it failed

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("segments")
        return d


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


@dataclasses.dataclass
class Replay:
    config: AllocatorConfig
    faithful: bool  # replayed with the settings the capture was recorded with
    limit: int | None
    devices: dict[int, DeviceAllocator]
    # After each event (index e + 1; 0 is the start), summed over devices:
    reserved: np.ndarray
    allocated: np.ndarray  # bytes of allocated blocks (rounded)
    active: np.ndarray  # allocated + freed blocks still awaiting another stream
    largest_free: np.ndarray  # largest cached free block
    ooms: list[OomRecord]
    avoided_ooms: list[int]  # recorded OOM requests the model could serve
    states: dict[int, list[dict[str, Any]]]
    fidelity: Fidelity | None
    warnings: list[str]
    replayed_until: int = -1  # the last event replayed; the timelines carry its state on

    @property
    def peak_reserved(self) -> int:
        return int(self.reserved.max()) if len(self.reserved) else 0

    def peak_event(self, which: str = "reserved") -> int:
        return int(np.argmax(getattr(self, which))) - 1

    @property
    def cached_free(self) -> np.ndarray:
        return self.reserved - self.active

    def stats(self) -> dict[str, int]:
        keys = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_gc_runs")
        return {k: sum(getattr(d, k) for d in self.devices.values()) for k in keys}


def _segments(baseline: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A baseline's segments with every field the replay reads (hand-made
    or older baselines may leave some out)."""
    out = []
    for s in (baseline or {}).get("segments") or ():
        total = int(s["total_size"])
        blocks = s.get("blocks")
        if blocks is None:
            blocks = [[total, int(s.get("requested_size", 0)), bool(s.get("allocated_size")),
                       bool(s.get("active_size"))]]
        out.append({"device": int(s.get("device", 0)), "address": int(s["address"]), "total_size": total,
                    "stream": int(s.get("stream", 0)), "is_large": bool(s.get("is_large", total != 2 << 20)),
                    "is_expandable": bool(s.get("is_expandable", False)), "pool": list(s.get("pool") or (0, 0)),
                    "blocks": blocks})
    return out


def _device_info(base: dict[str, Any] | None, metadata: dict[str, Any]) -> dict[int, dict[str, Any]]:
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
    return info


def _pending_at(baseline: dict[str, Any] | None) -> set[int]:
    """Addresses of the blocks a baseline shows freed but still in use on
    another stream (active, not allocated)."""
    out: set[int] = set()
    for s in _segments(baseline or {}):
        addr = int(s["address"])
        for size, _requested, allocated, active in s["blocks"]:
            if active and not allocated:
                out.add(addr)
            addr += int(size)
    return out


def deferred_frees(cap: Capture) -> np.ndarray:
    """Per event: a FREE whose block stayed busy until a later FREE_COMPLETED,
    or until the end of the recording (the end baseline shows it pending)."""
    ev = cap.events
    pending_at_end = _pending_at(cap.baseline("end"))
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


class _Checker:
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


class _CheckedAllocator(DeviceAllocator):
    checker: _Checker

    def _emit(self, kind: str, addr: int, size: int, stream: int) -> None:
        super()._emit(kind, addr, size, stream)
        self.checker.check(self.events[-1])


def replay(cap: Capture, config: AllocatorConfig | None = None, *, limit: int | None = None,
           states_at: Iterable[int] = (), stop_after: int | None = None) -> Replay:
    """Replays the capture's requests. config None: the recorded settings
    (with fidelity checks). limit: the total memory of a hypothetical device
    (the memory outside PyTorch measured at the start still counts).
    stop_after: replay only the events up to this index (the timelines hold
    the last state after it; fidelity is checked that far and the end
    snapshot is not compared; Replay.replayed_until says where it stopped)."""
    if "cuda" not in (cap.metadata.get("devices_recorded") or ()):
        raise NotACudaCapture(f"{cap.path} is not a CUDA recording: there is no caching allocator to replay")
    base = cap.baseline("start")
    recorded = recorded_config(base, cap.metadata)
    cfg = config or recorded
    faithful = cfg == recorded and limit is None
    ev = cap.events
    n = len(ev)
    stream_dev = np.array([s.device for s in cap.streams] or [-2], np.int64)
    stream_handle = [s.handle for s in cap.streams]
    info = _device_info(base, cap.metadata)
    segment_order = free_block_order(cap.metadata.get("torch"))
    warnings: list[str] = []

    seg_idx = np.flatnonzero((ev.kind >= EventKind.SEGMENT_ALLOC) & (ev.kind <= EventKind.SEGMENT_UNMAP))
    rec_by_dev: dict[int, list[tuple[int, str, int, int]]] = {}
    for i, k, a, s, st in zip(seg_idx.tolist(), ev.kind[seg_idx].tolist(), ev.addr[seg_idx].tolist(),
                              ev.size[seg_idx].tolist(), ev.stream[seg_idx].tolist(), strict=True):
        rec_by_dev.setdefault(int(stream_dev[st]), []).append((i, _KIND_NAMES[k], a, s))

    # Recorded reserved bytes per device over time: where a recorded OOM
    # says how much the device had free, that bounds what cudaMalloc could get.
    seg_segments = _segments(base)
    high = max([int(s["address"]) + int(s["total_size"]) for s in seg_segments]
               + [int(a) + int(s) for a, s in zip(ev.addr[seg_idx].tolist(), ev.size[seg_idx].tolist(), strict=True)]
               + [0])
    max_total = max([v.get("total", 0) for v in info.values()] + [1 << 40])
    synthetic = BumpAddresses(((high + 2 * max_total) >> 30) + 1 << 30)

    devices: dict[int, DeviceAllocator] = {}
    live: dict[int, tuple[DeviceAllocator, Block]] = {}
    pending: dict[int, tuple[DeviceAllocator, Block]] = {}

    def device(d: int) -> DeviceAllocator:
        dev = devices.get(d)
        if dev is None:
            meta = info.get(d, {})
            total = int(meta.get("total", 0))
            outside = total - int(meta.get("free", total)) - int(meta.get("reserved", 0))
            capacity: int | None
            if limit is not None:
                capacity = limit - max(outside, 0)
            elif "free" in meta:
                capacity = int(meta["free"]) + int(meta.get("reserved", 0))
            else:
                capacity = None
            checker = _Checker(rec_by_dev.get(d, []), faithful, synthetic)
            dev = _CheckedAllocator(cfg, device=d, total=limit if limit is not None else total, capacity=capacity,
                                    addresses=checker.address, segment_order=segment_order)
            dev.checker = checker
            if "fraction" in meta:
                dev.set_fraction(meta["fraction"])
            if cfg.per_process_memory_fraction is not None and not faithful:
                dev.set_fraction(cfg.per_process_memory_fraction)
            devices[d] = dev
        return dev

    for s in seg_segments:
        device(int(s.get("device", 0)))
    for d, dev in devices.items():
        loaded = load_segments(dev, [s for s in seg_segments if int(s.get("device", 0)) == d])
        for addr, b in loaded.items():
            live[addr] = (dev, b)
        for b in dev.pending:
            pending[b.addr] = (dev, b)
    for d in info:
        device(d)

    # A recorded OOM bounds the device: it had `free` bytes besides what the
    # allocator held. (The model's capacity is the smallest such bound.)
    oom_idx = np.flatnonzero(ev.kind == EventKind.OOM)
    if limit is None and len(oom_idx):
        for d, dev in devices.items():
            rec_reserved = recorded_reserved(cap, device=d)
            for i in oom_idx[stream_dev[ev.stream[oom_idx]] == d].tolist():
                free = int(ev.arg[i])
                if free > 0:
                    bound = free + int(rec_reserved[i + 1])
                    dev.capacity = bound if dev.capacity is None else min(dev.capacity, bound)

    deferred = deferred_frees(cap)
    targets = sorted(set(int(t) for t in states_at))
    states: dict[int, list[dict[str, Any]]] = {}
    t_ptr = 0

    def snapshot() -> list[dict[str, Any]]:
        return [s for d in sorted(devices) for s in segments(devices[d])]

    while t_ptr < len(targets) and targets[t_ptr] < 0:
        states[targets[t_ptr]] = snapshot()
        t_ptr += 1

    def totals() -> tuple[int, int, int, int]:
        if len(devices) == 1:
            (dev,) = devices.values()
            return dev.reserved, dev.allocated, dev.active, dev.largest_free()
        r = a = c = lg = 0
        for dev in devices.values():
            r += dev.reserved
            a += dev.allocated
            c += dev.active
            lg = max(lg, dev.largest_free())
        return r, a, c, lg

    # The totals after each replayed event; carried over the others at the end.
    after: list[tuple[int, int, int, int]] = [totals()]
    replayed: list[int] = []
    kinds = (EventKind.ALLOC, EventKind.FREE, EventKind.FREE_COMPLETED, EventKind.OOM, EventKind.EMPTY_CACHE,
             EventKind.SET_FRACTION)
    todo = np.flatnonzero(np.isin(ev.kind, kinds))
    ooms: list[OomRecord] = []
    avoided: list[int] = []
    allocs = address_mismatches = unknown_frees = 0
    if stop_after is not None:
        todo = todo[todo <= stop_after]
    ALLOC, FREE, DONE, OOM = int(EventKind.ALLOC), int(EventKind.FREE), int(EventKind.FREE_COMPLETED), int(EventKind.OOM)
    EMPTY, FRACTION = int(EventKind.EMPTY_CACHE), int(EventKind.SET_FRACTION)
    cols = zip(todo.tolist(), ev.kind[todo].tolist(), ev.addr[todo].tolist(), ev.size[todo].tolist(),
               ev.block[todo].tolist(), ev.stream[todo].tolist(), ev.arg[todo].tolist(), strict=True)
    for i, k, addr, size, block, st, arg in cols:
        while t_ptr < len(targets) and targets[t_ptr] < i:
            states[targets[t_ptr]] = snapshot()
            t_ptr += 1
        if k == ALLOC:
            d = int(stream_dev[st])
            if d >= 0:
                held = live.get(addr)
                if held is not None and held[1].tag == -1 and held[1].allocated:
                    pass  # the start snapshot already holds it (docs/format.md, BASELINE)
                else:
                    dev = device(d)
                    dev.request = i
                    dev.force = True
                    before = dev.num_ooms
                    b = dev.malloc(size, stream_handle[st])
                    dev.force = False
                    assert b is not None
                    if dev.num_ooms > before:
                        ooms.append(_oom(dev, i, size, st, stream_handle[st], False, ooms))
                    live[addr] = (dev, b)
                    allocs += 1
                    if faithful and b.addr != addr:
                        address_mismatches += 1
        elif k == FREE:
            held = live.pop(addr, None)
            if held is None:
                unknown_frees += 1
            else:
                dev, b = held
                dev.request = i
                dev.free(b, bool(deferred[i]))
                if deferred[i]:
                    pending[addr] = held
        elif k == DONE:
            held = pending.pop(addr, None)
            if held is not None:
                held[0].request = i
                held[0].complete(held[1])
        elif k == OOM:
            d = int(stream_dev[st])
            if d >= 0:
                dev = device(d)
                dev.request = i
                want = size or block
                b = dev.malloc(want, stream_handle[st])
                if b is None:
                    ooms.append(_oom(dev, i, want, st, stream_handle[st], True, ooms))
                else:
                    avoided.append(i)
                    dev.free(b)
        elif k == EMPTY:
            if arg == 0:
                for dev in devices.values():
                    dev.request = i
                    dev.empty_cache()
        elif k == FRACTION:
            d = int(stream_dev[st])
            if d >= 0:
                device(d).set_fraction(arg / 1e9)
        after.append(totals())
        replayed.append(i)
    # Position p (after event p - 1) takes the totals of the last replayed event before it.
    which = np.zeros(n + 1, np.int64)
    which[np.array(replayed, np.int64) + 1] = np.arange(1, len(replayed) + 1)
    which = np.maximum.accumulate(which)
    table = np.array(after, np.int64).reshape(-1, 4)
    reserved, allocated, active, largest = (np.ascontiguousarray(table[which, j]) for j in range(4))
    until = n - 1 if stop_after is None else min(n - 1, stop_after)
    while t_ptr < len(targets) and targets[t_ptr] <= until:
        states[targets[t_ptr]] = snapshot()
        t_ptr += 1
    if unknown_frees:
        warnings.append(f"{unknown_frees} frees of memory the replay did not know (ignored)")

    fidelity = None
    if faithful:
        checkers = [dev.checker for dev in devices.values()]  # type: ignore[attr-defined]
        mismatch = next((c.first_mismatch for c in checkers if c.first_mismatch is not None), None)
        end = cap.baseline("end")
        fidelity = Fidelity(
            recorded_segment_events=int(np.count_nonzero(seg_idx <= until)),
            simulated_segment_events=sum(len(dev.events) for dev in devices.values()),
            matched=sum(c.j for c in checkers), first_mismatch=mismatch, allocations=allocs,
            address_mismatches=address_mismatches,
            end_snapshot=compare_snapshot(snapshot(), _segments(end)) if end and until == n - 1 else None,
            checked_until=until)
    return Replay(cfg, faithful, limit, devices, reserved, allocated, active, largest, ooms, avoided, states,
                  fidelity, warnings, until)


def recorded_reserved(cap: Capture, device: int | None = None) -> np.ndarray:
    """Bytes the caching allocator held after each event (index e + 1; 0 is
    the start), from the start baseline and the recorded segment events."""
    ev = cap.events
    base = cap.baseline("start") or {}
    segs = [s for s in base.get("segments") or () if device is None or int(s.get("device", 0)) == device]
    sign = np.zeros(len(ev), np.int64)
    sign[(ev.kind == EventKind.SEGMENT_ALLOC) | (ev.kind == EventKind.SEGMENT_MAP)] = 1
    sign[(ev.kind == EventKind.SEGMENT_FREE) | (ev.kind == EventKind.SEGMENT_UNMAP)] = -1
    if device is not None:
        stream_dev = np.array([s.device for s in cap.streams] or [-2], np.int64)
        sign[stream_dev[ev.stream] != device] = 0
    out = np.zeros(len(ev) + 1, np.int64)
    out[0] = sum(int(s["total_size"]) for s in segs)
    out[1:] = out[0] + np.cumsum(sign * ev.size.astype(np.int64))
    return out


def request_at(cap: Capture, e: int) -> int:
    """The event whose replay produced event e: a recorded segment event
    belongs to the allocation (or OOM) after it; any other event to itself."""
    ev = cap.events
    if e < 0 or not (EventKind.SEGMENT_ALLOC <= int(ev.kind[e]) <= EventKind.SEGMENT_UNMAP):
        return e
    later = np.flatnonzero((ev.kind[e:] == EventKind.ALLOC) | (ev.kind[e:] == EventKind.OOM))
    return e + int(later[0]) if len(later) else e


def _oom(dev: DeviceAllocator, i: int, size: int, st: int, stream: int, recorded: bool,
         earlier: list[OomRecord]) -> OomRecord:
    # Keep the allocator's state for the first few failures only: a replay
    # that runs out everywhere would otherwise hold a copy per request.
    state = segments(dev) if len(earlier) < 3 else []
    return OomRecord(i, dev.device, size, round_size(size, dev.config.roundup_power2_divisions), stream, recorded,
                     dev.reserved, dev.allocated, dev.active, dev.capacity, dev.allowed, state)


def compare_snapshot(state: list[dict[str, Any]], snapshot: list[dict[str, Any]]) -> dict[str, Any]:
    """Compares a reconstructed state with a baseline's segments: the same
    segments (address, size, stream, pool kind) holding the same blocks (size,
    requested bytes, allocated, active)."""

    def norm_state(s: dict[str, Any]) -> tuple:
        blocks = tuple((b[1], b[2] if b[3] != "inactive" else 0, b[3] == "allocated", b[3] != "inactive")
                       for b in s["blocks"])
        return (int(s["device"]), int(s["address"]), int(s["total_size"]), int(s["stream"]), bool(s["is_large"]),
                bool(s["is_expandable"]), blocks)

    def norm_snap(s: dict[str, Any]) -> tuple:
        blocks = tuple((int(b[0]), int(b[1]) if (b[2] or b[3]) else 0, bool(b[2]), bool(b[3])) for b in s["blocks"])
        return (int(s.get("device", 0)), int(s["address"]), int(s["total_size"]), int(s["stream"]),
                bool(s["is_large"]), bool(s["is_expandable"]), blocks)

    a = sorted(norm_state(s) for s in state)
    b = sorted(norm_snap(s) for s in snapshot)
    only_model = [x[:6] for x in a if x not in b]
    only_snapshot = [x[:6] for x in b if x not in a]
    return {"equal": a == b, "segments": len(b), "only_in_replay": only_model[:5], "only_in_snapshot": only_snapshot[:5]}
