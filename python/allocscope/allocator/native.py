"""The replay's hot loop in C++ (allocscope._analysis, csrc/analysis/*.cpp): the
same model as model.py and the same driver as replay.py, decision for
decision, at millions of requests per second, for what most captures use
(the shared pools, cudaMalloc'd segments, every other setting). Captures that
use expandable segments or private pools (CUDA graphs, MemPool) replay in
Python, as does everything where the module is not built. The Python model
stays the reference: the tests replay every fixture and generated request
streams both ways and require the same result (tests/unit/test_native_replay.py).

This module says whether the native replay can take a capture
(unsupported), and converts its inputs and its result (inputs, result).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from ..capture.format import EventKind
from ..common.native import analysis
from .config import AllocatorConfig, recorded_config
from .recorded import KIND_NAMES
from .segments import ALLOCATED, INACTIVE, PENDING_FREE, BlockInfo, SegmentInfo, baseline_segments

if TYPE_CHECKING:
    from ..capture.reader import Capture
    from .model import DeviceAllocator

__all__ = ["DeviceCounters", "built", "can_replay", "first_mismatch", "inputs", "run", "segment_infos", "unsupported"]

_POOL_KINDS = (EventKind.POOL_BEGIN, EventKind.POOL_END, EventKind.POOL_RELEASE, EventKind.POOL_ALLOC)
_STATES = (ALLOCATED, PENDING_FREE, INACTIVE)


def built() -> bool:
    """Whether allocscope._analysis is built (it needs no torch)."""
    return analysis() is not None


def unsupported(cap: Capture, config: AllocatorConfig, start: list[SegmentInfo]) -> str | None:
    """Why the native replay cannot replay this capture with these settings
    (None: it can)."""
    if not built():
        return "allocscope._analysis is not built"
    if config.expandable_segments:
        return "expandable segments"
    if any(s.is_expandable for s in start):
        return "expandable segments in the start baseline"
    if any(s.pool != (0, 0) for s in start):
        return "private pools in the start baseline"
    if np.isin(cap.events.kind, np.array(_POOL_KINDS, np.uint8)).any():
        return "private pools (CUDA graphs, MemPool)"
    if any(b.get("label") == "settings" for b in cap.baselines):
        return "allocator settings changed while recording"
    return None


def can_replay(cap: Capture, config: AllocatorConfig | None = None) -> bool:
    """Whether replay(cap, config) runs natively (config None: the recorded settings)."""
    base = cap.baseline("start")
    return unsupported(cap, config or recorded_config(base, cap.metadata), baseline_segments(base)) is None


@dataclasses.dataclass
class DeviceCounters:
    """A natively replayed device's counters (Replay.devices; the Python
    replay keeps its DeviceAllocator there instead)."""

    device: int
    num_alloc_retries: int
    num_ooms: int
    num_device_alloc: int
    num_device_free: int
    num_gc_runs: int
    reserved: int
    allocated: int
    active: int
    peak_reserved: int
    peak_allocated: int
    emitted: int  # segment events made
    matched: int  # leading segment events equal to the recorded ones
    mismatch: tuple | None


def inputs(config: AllocatorConfig, segment_order: bool, devices: dict[int, DeviceAllocator],
           start: list[SegmentInfo]) -> tuple[Any, list[Any]]:
    """The native replay's settings (_analysis.Config) and devices
    (_analysis.DeviceSetup), from the Python replay's devices as it set them
    up (sizes, capacity, fraction; creation order)."""
    mod = analysis()
    assert mod is not None
    cfg = mod.Config(max_split_size=config.max_split_size,
                     max_non_split_rounding_size=config.max_non_split_rounding_size,
                     large_segment_size=config.large_segment_size,
                     garbage_collection_threshold=float(config.garbage_collection_threshold),
                     roundup_power2_divisions=[int(d) for d in config.roundup_power2_divisions],
                     segment_order=segment_order)
    setups = []
    for d, dev in devices.items():
        segs = sorted((s for s in start if s.device == d), key=lambda s: s.address)
        loaded = [mod.LoadedSegment(addr=s.address, size=s.total_size, stream=s.stream, large=s.is_large,
                                    blocks=[mod.LoadedBlock(addr=b.address, size=b.size, requested=b.requested,
                                                            active=b.active, allocated=b.allocated)
                                            for b in s.blocks])
                  for s in segs]
        # A capacity below zero (a limit under the memory outside PyTorch) fails every cudaMalloc, as 0 does.
        capacity = -1 if dev.capacity is None else max(dev.capacity, 0)
        setups.append(mod.DeviceSetup(device=d, total=dev.total, capacity=capacity,
                                      allowed=-1 if dev.allowed is None else dev.allowed, start=loaded))
    return cfg, setups


def run(cfg: Any, faithful: bool, synthetic_start: int, setups: list[Any], cap: Capture, deferred: np.ndarray,
        bypassed: np.ndarray, stream_device: list[int], stream_handle: list[int], targets: list[int],
        stop_after: int | None) -> dict[str, Any]:
    """The native replay's raw result (keys: reserved, allocated, active,
    largest_free, block_sizes, ooms, avoided_ooms, states, devices,
    final_state, allocations, address_mismatches, unknown_frees). bypassed:
    per event, not a request of the cache (recorded.bypassed_cache)."""
    mod = analysis()
    assert mod is not None
    ev = cap.events
    col = np.ascontiguousarray
    kind = col(ev.kind, np.uint8)
    if cap.prefix_events or bypassed.any():
        kind = kind.copy()
        kind[:cap.prefix_events] = 0  # a checkpoint's events: in the state its baseline holds, not requests
        kind[bypassed] = 0
    return mod.replay(cfg, faithful, synthetic_start, setups, kind, col(ev.addr, np.uint64),
                      col(ev.size, np.uint64), col(ev.block, np.uint64), col(ev.arg, np.uint64),
                      col(ev.stream, np.uint16), col(deferred, np.uint8), stream_device, stream_handle, targets,
                      len(ev) - 1 if stop_after is None else max(int(stop_after), -1))


def segment_infos(raw: list[tuple]) -> list[SegmentInfo]:
    """The native result's segments as SegmentInfo (shared pools only)."""
    return [SegmentInfo(device=d, address=a, total_size=n, stream=st, is_large=large, is_expandable=False,
                        pool=(0, 0), blocks=tuple(BlockInfo(ba, bs, req, _STATES[state], tag)
                                                  for ba, bs, req, state, tag in blocks))
            for d, a, n, st, large, blocks in raw]


def first_mismatch(mismatch: tuple | None) -> dict[str, Any] | None:
    """A native device's first segment-event mismatch, as SegmentChecker writes it."""
    if mismatch is None:
        return None
    position, rec, (request, kind, addr, size) = mismatch
    recorded = None if rec is None else {"event": rec[0], "kind": KIND_NAMES[rec[1]], "addr": rec[2], "size": rec[3]}
    return {"position": position, "recorded": recorded,
            "simulated": {"event": request, "kind": KIND_NAMES[kind], "addr": addr, "size": size}}
