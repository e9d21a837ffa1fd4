"""Replaying a CUDA capture through the caching-allocator model.

With the recorded settings (config=None) the replay reconstructs the
allocator's state at any event and checks itself against the recording: every
SEGMENT_ALLOC/FREE/MAP/UNMAP it makes must be the recorded one (kind, address,
size, in order), every block it hands out must be at the recorded address, and
its final state must equal the end baseline's snapshot. With other settings
(or a smaller card) it predicts what the same requests would have done.
"""

from __future__ import annotations

import bisect
from typing import Iterable

import numpy as np

from ..capture.baselines import closing_baseline
from ..capture.format import EventKind
from ..capture.reader import Capture
from ..common.errors import InputError
from . import native
from .blocks import SEGMENT_ALLOC, Block, BumpAddresses
from .config import AllocatorConfig, recorded_config
from .model import DeviceAllocator, free_block_order
from .recorded import (KIND_NAMES, Fidelity, SegmentChecker, bypassed_cache, deferred_frees, device_info,
                       end_to_compare, end_window, recorded_fraction, recorded_reserved, settings_changes,
                       settle_end_snapshot)
from .results import OomRecord, Replay, oom_record
from .segments import SegmentInfo, baseline_segments
from .state import compare_snapshot, load_segments, segments

__all__ = ["NotACudaCapture", "OomRecord", "Replay", "replay"]


class NotACudaCapture(InputError):
    """The capture recorded no CUDA allocator (a CPU recording)."""


def replay(cap: Capture, config: AllocatorConfig | None = None, *, limit: int | None = None,
           states_at: Iterable[int] = (), stop_after: int | None = None, engine: str = "auto") -> Replay:
    """Replays the capture's requests. config None: the recorded settings
    (with fidelity checks). limit: the total memory of a hypothetical device
    (the memory outside PyTorch measured at the start still counts).
    stop_after: replay only the events up to this index (the timelines hold
    the last state after it; fidelity is checked that far and the end
    snapshot is not compared; Replay.replayed_until says where it stopped).
    engine: "native" (C++, native.py; ValueError where it cannot replay the
    capture), "python" (this module's model, the reference) or "auto" (native
    where it can)."""
    if "cuda" not in (cap.metadata.get("devices_recorded") or ()):
        raise NotACudaCapture(f"{cap.path} is not a CUDA recording: there is no caching allocator to replay")
    if engine not in ("auto", "native", "python"):
        raise InputError(f"unknown replay engine {engine!r} (auto, native, python)")
    run = _Run(cap, config, limit)
    asked = set(int(t) for t in states_at)
    window = end_window(cap) if run.faithful and stop_after is None else []
    targets = sorted(asked | set(window))
    if engine != "python":
        reason = native.unsupported(cap, run.cfg, run.start)
        if reason is None:
            return settle_end_snapshot(run.replay_native(targets, stop_after), cap, window, asked)
        if engine == "native":
            raise InputError(f"the native replay cannot replay {cap.path}: {reason}")
    return settle_end_snapshot(run.replay(targets, stop_after), cap, window, asked)



_ALLOC, _FREE, _DONE = int(EventKind.ALLOC), int(EventKind.FREE), int(EventKind.FREE_COMPLETED)
_OOM, _EMPTY, _FRACTION = int(EventKind.OOM), int(EventKind.EMPTY_CACHE), int(EventKind.SET_FRACTION)
_POOL_BEGIN, _POOL_END = int(EventKind.POOL_BEGIN), int(EventKind.POOL_END)
_POOL_RELEASE, _POOL_ALLOC = int(EventKind.POOL_RELEASE), int(EventKind.POOL_ALLOC)
_REQUESTS = (EventKind.ALLOC, EventKind.FREE, EventKind.FREE_COMPLETED, EventKind.OOM, EventKind.EMPTY_CACHE,
             EventKind.SET_FRACTION, EventKind.POOL_BEGIN, EventKind.POOL_END, EventKind.POOL_RELEASE,
             EventKind.POOL_ALLOC)


class _Run:
    """One replay: the devices' allocators set from the start baseline, then
    driven by the capture's requests (replay())."""

    def __init__(self, cap: Capture, config: AllocatorConfig | None, limit: int | None):
        self.cap, self.limit = cap, limit
        ev = cap.events
        base = cap.baseline("start")
        recorded = recorded_config(base, cap.metadata)
        self.cfg = config or recorded
        self.faithful = self.cfg == recorded and limit is None
        # Settings the program changed while recording, applied where they
        # changed (replaying the recorded settings; a what-if keeps its own).
        self.changes = settings_changes(cap) if config is None else []
        self.cfg_now = self.cfg  # the settings in effect at the request being replayed
        self.stream_dev = np.array([s.device for s in cap.streams] or [-2], np.int64)
        self.stream_handle = [s.handle for s in cap.streams]
        self.info = device_info(base, cap.metadata, closing_baseline(cap))
        self.segment_order = free_block_order(cap.metadata.get("torch"))
        self.warnings: list[str] = []
        self.seg_idx = np.flatnonzero((ev.kind >= EventKind.SEGMENT_ALLOC) & (ev.kind <= EventKind.SEGMENT_UNMAP))
        self.recorded_segments: dict[int, list[tuple[int, str, int, int]]] = {}
        for i, k, a, s, st in zip(self.seg_idx.tolist(), ev.kind[self.seg_idx].tolist(),
                                  ev.addr[self.seg_idx].tolist(), ev.size[self.seg_idx].tolist(),
                                  ev.stream[self.seg_idx].tolist(), strict=True):
            self.recorded_segments.setdefault(int(self.stream_dev[st]), []).append((i, KIND_NAMES[k], a, s))
        self.start = start = baseline_segments(base)
        # Segments no recording placed go far above every recorded address.
        high = max([s.address + s.total_size for s in start]
                   + [int(a) + int(s) for a, s in zip(ev.addr[self.seg_idx].tolist(), ev.size[self.seg_idx].tolist(),
                                                      strict=True)] + [0])
        max_total = max([v.get("total", 0) for v in self.info.values()] + [1 << 40])
        self.synthetic = BumpAddresses(((high + 2 * max_total) >> 30) + 1 << 30)
        self.devices: dict[int, DeviceAllocator] = {}
        self.checkers: dict[int, SegmentChecker] = {}
        self.live: dict[int, tuple[DeviceAllocator, Block]] = {}
        self.pending: dict[int, tuple[DeviceAllocator, Block]] = {}
        self.deferred = deferred_frees(cap)  # per event: a FREE that waits for another stream
        self.bypassed = bypassed_cache(cap)  # per event: an ALLOC past the cache (and its FREE): not replayed
        self.ready: list[tuple[int, int]] = []  # FREE_COMPLETED (event, address) awaiting the next request
        self.routed: dict[int, tuple[int, int]] = {}  # POOL_ALLOC: address -> the private pool of its ALLOC
        self.placed: set[int] = set()  # POOL_ALLOC size 1: the next ALLOC there is a checkpoint restore's
        self.ooms: list[OomRecord] = []
        self.avoided: list[int] = []  # recorded OOM requests the model could serve
        self.allocs = self.address_mismatches = 0
        self._load(start)
        if limit is None:
            self._bound_by_recorded_ooms()

    def device(self, d: int) -> DeviceAllocator:
        dev = self.devices.get(d)
        if dev is not None:
            return dev
        meta = self.info.get(d, {})
        total = int(meta.get("total", 0))
        outside = total - int(meta.get("free", total)) - int(meta.get("reserved", 0))
        capacity: int | None
        if self.limit is not None:
            capacity = self.limit - max(outside, 0)
        elif "free" in meta:
            capacity = int(meta["free"]) + int(meta.get("reserved", 0))
        else:
            capacity = None
        checker = self.checkers[d] = SegmentChecker(self.recorded_segments.get(d, []), self.faithful, self.synthetic)
        dev = DeviceAllocator(self.cfg_now, device=d, total=self.limit if self.limit is not None else total,
                              capacity=capacity, addresses=checker.address, segment_order=self.segment_order,
                              on_segment_event=checker.check,
                              recorded_frees=checker.upcoming_frees if self.faithful else None)
        if "fraction" in meta:
            dev.set_fraction(meta["fraction"])
        if self.cfg.per_process_memory_fraction is not None and not self.faithful:
            dev.set_fraction(self.cfg.per_process_memory_fraction)
        self.devices[d] = dev
        return dev

    def _load(self, start: list[SegmentInfo]) -> None:
        for s in start:
            self.device(s.device)
        for d, dev in self.devices.items():
            loaded = load_segments(dev, [s for s in start if s.device == d])
            for addr, b in loaded.items():
                self.live[addr] = (dev, b)
            for b in dev.pending:
                self.pending[b.addr] = (dev, b)
        for d in self.info:
            self.device(d)

    def _bound_by_recorded_ooms(self) -> None:
        """A recorded OOM bounds the device: it had `free` bytes besides what
        the allocator held. (The model's capacity is the smallest such bound.)"""
        ev = self.cap.events
        oom_idx = np.flatnonzero(ev.kind == EventKind.OOM)
        if not len(oom_idx):
            return
        for d, dev in self.devices.items():
            rec_reserved = recorded_reserved(self.cap, device=d)
            for i in oom_idx[self.stream_dev[ev.stream[oom_idx]] == d].tolist():
                free = int(ev.arg[i])
                if free > 0:
                    bound = free + int(rec_reserved[i + 1])
                    dev.capacity = bound if dev.capacity is None else min(dev.capacity, bound)

    def snapshot(self) -> list[SegmentInfo]:
        return [s for d in sorted(self.devices) for s in segments(self.devices[d])]

    def totals(self) -> tuple[int, int, int, int]:
        if len(self.devices) == 1:
            (dev,) = self.devices.values()
            return dev.reserved, dev.allocated, dev.active, dev.largest_free()
        r = a = c = lg = 0
        for dev in self.devices.values():
            r += dev.reserved
            a += dev.allocated
            c += dev.active
            lg = max(lg, dev.largest_free())
        return r, a, c, lg

    def replay(self, targets: list[int], stop_after: int | None) -> Replay:
        ev = self.cap.events
        n = len(ev)
        self.block_sizes = np.zeros(n, np.int64)
        states: dict[int, list[SegmentInfo]] = {}
        t_ptr = 0
        while t_ptr < len(targets) and targets[t_ptr] < 0:
            states[targets[t_ptr]] = self.snapshot()
            t_ptr += 1
        # The totals after each replayed event; carried over the others at the end.
        after: list[tuple[int, int, int, int]] = [self.totals()]
        replayed: list[int] = []
        unknown_frees = 0
        todo = np.flatnonzero(np.isin(ev.kind, _REQUESTS) & ~self.bypassed)
        todo = todo[todo >= self.cap.prefix_events]  # a checkpoint's: in the state its baseline holds
        if stop_after is not None:
            todo = todo[todo <= stop_after]
        cols = zip(todo.tolist(), ev.kind[todo].tolist(), ev.addr[todo].tolist(), ev.size[todo].tolist(),
                   ev.block[todo].tolist(), ev.stream[todo].tolist(), ev.arg[todo].tolist(), strict=True)
        changes = list(self.changes)
        for i, k, addr, size, block, st, arg in cols:
            while changes and changes[0][0] < i:
                self._change_settings(changes.pop(0)[1])
            while t_ptr < len(targets) and targets[t_ptr] < i:
                states[targets[t_ptr]] = self.snapshot()
                t_ptr += 1
            if k == _DONE:
                # c10 completes deferred frees inside the next malloc: when
                # exactly is _process_events' call.
                self.ready.append((i, addr))
            elif k == _POOL_ALLOC:
                self.routed[addr] = (arg, block)  # the next ALLOC at addr (OOM: 0)
                if size == 1:
                    self.placed.add(addr)
            else:
                if self.ready:
                    self._process_events(i, k, addr, size or block if k == _OOM else size, st)
                unknown_frees += not self._request(i, k, addr, size, block, st, arg)
                self._complete(i, self.ready)  # what the request left pending, c10 completed in it
            after.append(self.totals())
            replayed.append(i)
        self._complete(len(ev), self.ready)
        # Position p (after event p - 1) takes the totals of the last replayed event before it.
        which = np.zeros(n + 1, np.int64)
        which[np.array(replayed, np.int64) + 1] = np.arange(1, len(replayed) + 1)
        which = np.maximum.accumulate(which)
        table = np.array(after, np.int64).reshape(-1, 4)
        reserved, allocated, active, largest = (np.ascontiguousarray(table[which, j]) for j in range(4))
        until = n - 1 if stop_after is None else min(n - 1, stop_after)
        while t_ptr < len(targets) and targets[t_ptr] <= until:
            states[targets[t_ptr]] = self.snapshot()
            t_ptr += 1
        if unknown_frees:
            self.warnings.append(f"{unknown_frees} frees of memory the replay did not know (ignored)")
        return Replay(self.cfg, self.faithful, self.limit, self.devices, reserved, allocated, active, largest,
                      self.ooms, self.avoided, states, self._fidelity(until), self.warnings, until, self.block_sizes)

    def replay_native(self, targets: list[int], stop_after: int | None) -> Replay:
        """replay() in C++ (native.py): the same result."""
        ev = self.cap.events
        for d in sorted({int(x) for x in self.stream_dev.tolist() if x >= 0}):
            self.device(d)  # every device a request can reach, as replay() makes them on first use
        cfg, setups = native.inputs(self.cfg, self.segment_order, self.devices, self.start)
        out = native.run(cfg, self.faithful, self.synthetic.next, setups, self.cap, self.deferred, self.bypassed,
                         [int(x) for x in self.stream_dev.tolist()], list(self.stream_handle), targets, stop_after)
        devices = {d["device"]: native.DeviceCounters(**d) for d in out["devices"]}
        ooms = [OomRecord(*o[:9], None if o[9] < 0 else o[9], None if o[10] < 0 else o[10],
                          native.segment_infos(o[11])) for o in out["ooms"]]
        states = {at: native.segment_infos(segs) for at, segs in out["states"]}
        if out["unknown_frees"]:
            self.warnings.append(f"{out['unknown_frees']} frees of memory the replay did not know (ignored)")
        n = len(ev)
        until = n - 1 if stop_after is None else min(n - 1, stop_after)
        fidelity = None
        if self.faithful:
            mismatch = next((native.first_mismatch(d.mismatch) for d in devices.values() if d.mismatch), None)
            end = end_to_compare(self.cap, until)
            final = native.segment_infos(out["final_state"])
            fidelity = Fidelity(
                recorded_segment_events=int(np.count_nonzero(self.seg_idx <= until)),
                simulated_segment_events=sum(d.emitted for d in devices.values()),
                matched=sum(d.matched for d in devices.values()), first_mismatch=mismatch,
                allocations=out["allocations"], address_mismatches=out["address_mismatches"],
                end_snapshot=compare_snapshot(final, baseline_segments(end)) if end else None,
                checked_until=until)
        return Replay(self.cfg, self.faithful, self.limit, devices, out["reserved"], out["allocated"],
                      out["active"], out["largest_free"], ooms, list(out["avoided_ooms"]), states, fidelity,
                      self.warnings, until, out["block_sizes"])

    def _change_settings(self, cfg: AllocatorConfig) -> None:
        self.cfg_now = cfg
        for dev in self.devices.values():
            dev.set_config(cfg)

    def _request(self, i: int, k: int, addr: int, size: int, block: int, st: int, arg: int) -> bool:
        """Replays one request; False: a free of memory the replay does not know."""
        if k == _ALLOC:
            self._alloc(i, addr, size, st)
        elif k == _FREE:
            return self._free(i, addr)
        elif k == _OOM:
            self._oom(i, size or block, st)
        elif k == _EMPTY:
            # a private pool's own empty_cache is not modelled; size 1: it released nothing
            # (with other settings, a what-if, it might have)
            if arg == 0 and block == 0 and (size != 1 or not self.faithful):
                for dev in self.devices.values():
                    dev.request = i
                    dev.empty_cache()
        else:
            d = int(self.stream_dev[st])
            if d < 0:
                return True
            dev = self.device(d)
            if k == _FRACTION:
                dev.set_fraction(recorded_fraction(arg, block))
            elif k == _POOL_BEGIN:
                dev.begin_pool((arg, block), capture=addr != 1)
            elif k == _POOL_END:
                dev.end_pool((arg, block))
            elif k == _POOL_RELEASE:
                dev.request = i
                dev.release_pool((arg, block))
        return True

    def _complete(self, i: int, ready: list[tuple[int, int]]) -> None:
        for _, addr in ready:
            held = self.pending.pop(addr, None)
            if held is not None:
                held[0].request = i
                held[0].complete(held[1])
        ready.clear()

    def _process_events(self, i: int, k: int, addr: int, size: int, st: int) -> None:
        """Completes the deferred frees recorded just before request i that
        c10 found complete when its malloc began (process_events). The others
        it completed later in the same malloc, when it gave up on its cached
        blocks and synchronized every event (synchronize_and_free_events):
        those are the completions recorded after one of the malloc's segment
        events, and those whose early completion would not have produced the
        malloc's recorded segment events (tried on a copy of the model).
        They stay pending here until the model's own release completes them."""
        if k not in (_ALLOC, _OOM):
            self._complete(i, self.ready)
            return
        d = int(self.stream_dev[st])
        first = self._first_segment_event(d, self.ready[0][0], i)
        early = [r for r in self.ready if r[0] < first]
        dev = self.devices.get(d)
        if early and dev is not None and (k == _OOM or first < i):
            # (another device's pending blocks are not this allocator's to complete)
            blocks = [self.pending[a][1] for _, a in early if a in self.pending and self.pending[a][0] is dev]
            route = self.routed.get(0 if k == _OOM else addr)
            made = dev.trial(blocks, size, self.stream_handle[st], route) if blocks else []
            mine = self.recorded_segments.get(d, [])
            lo = bisect.bisect_left(mine, (first,))
            hi = bisect.bisect_left(mine, (i,))
            recorded = [(kind, a, n) for _, kind, a, n in mine[lo:hi]]
            if [(e.kind, e.addr if e.kind != SEGMENT_ALLOC else 0, e.size) for e in made] != \
                    [(kind, a if kind != SEGMENT_ALLOC else 0, n) for kind, a, n in recorded]:
                early = []
        self._complete(i, early)
        self.ready = [r for r in self.ready if r[0] >= first]

    def _first_segment_event(self, d: int, lo: int, hi: int) -> int:
        """The index of device d's first recorded segment event between lo and
        hi, or hi."""
        seg = self.seg_idx
        j = int(np.searchsorted(seg, lo))
        while j < len(seg) and seg[j] < hi:
            if int(self.stream_dev[self.cap.events.stream[seg[j]]]) == d:
                return int(seg[j])
            j += 1
        return hi

    def _alloc(self, i: int, addr: int, size: int, st: int) -> None:
        d = int(self.stream_dev[st])
        if d < 0:
            return
        held = self.live.get(addr)
        if held is not None and held[1].tag == -1 and held[1].allocated:
            return  # the start snapshot already holds it (docs/format.md, BASELINE)
        dev = self.device(d)
        dev.request = i
        before = dev.num_ooms
        placed = addr in self.placed
        self.placed.discard(addr)
        b = dev.malloc_as_recorded(size, self.stream_handle[st], self.routed.pop(addr, None), addr, placed,
                                   self.faithful)
        if dev.num_ooms > before:
            self.ooms.append(oom_record(dev, i, size, self.stream_handle[st], False, self.ooms))
        self.live[addr] = (dev, b)
        self.block_sizes[i] = b.size
        self.allocs += 1
        if self.faithful and b.addr != addr:
            self.address_mismatches += 1

    def _free(self, i: int, addr: int) -> bool:
        """False: a free of memory the replay does not know."""
        held = self.live.pop(addr, None)
        if held is None:
            return False
        dev, b = held
        dev.request = i
        deferred = bool(self.deferred[i])
        dev.free(b, deferred)
        if deferred:
            self.pending[addr] = held
        return True

    def _oom(self, i: int, want: int, st: int) -> None:
        """A recorded OOM: the model tries the request again."""
        d = int(self.stream_dev[st])
        if d < 0:
            return
        dev = self.device(d)
        dev.request = i
        b = dev.malloc(want, self.stream_handle[st], self.routed.pop(0, None))
        if b is None:
            self.ooms.append(oom_record(dev, i, want, self.stream_handle[st], True, self.ooms))
        else:
            self.avoided.append(i)
            dev.free(b)

    def _fidelity(self, until: int) -> Fidelity | None:
        if not self.faithful:
            return None
        checkers = list(self.checkers.values())
        mismatch = next((c.first_mismatch for c in checkers if c.first_mismatch is not None), None)
        end = end_to_compare(self.cap, until)
        return Fidelity(
            recorded_segment_events=int(np.count_nonzero(self.seg_idx <= until)),
            simulated_segment_events=sum(len(dev.events) for dev in self.devices.values()),
            matched=sum(c.j for c in checkers), first_mismatch=mismatch, allocations=self.allocs,
            address_mismatches=self.address_mismatches,
            end_snapshot=compare_snapshot(self.snapshot(), baseline_segments(end)) if end else None,
            checked_until=until)
