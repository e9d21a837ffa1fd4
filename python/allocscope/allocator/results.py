"""What a replay gives (allocator/replay.py): the allocator's totals after
each event, the requests it could not serve, and its fidelity."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import native
from .config import AllocatorConfig
from .model import DeviceAllocator
from .recorded import Fidelity
from .segments import SegmentInfo
from .sizes import round_size
from .state import segments

__all__ = ["OomRecord", "Replay", "oom_record"]


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
    segments: list[SegmentInfo]  # the allocator's state when it failed

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("segments")
        return d


@dataclasses.dataclass
class Replay:
    config: AllocatorConfig
    faithful: bool  # replayed with the settings the capture was recorded with
    limit: int | None
    devices: dict[int, DeviceAllocator | native.DeviceCounters]  # native replays keep counters only
    # After each event (index e + 1; 0 is the start), summed over devices:
    reserved: np.ndarray
    allocated: np.ndarray  # bytes of allocated blocks (rounded)
    active: np.ndarray  # allocated + freed blocks still awaiting another stream
    largest_free: np.ndarray  # largest cached free block
    ooms: list[OomRecord]
    avoided_ooms: list[int]  # recorded OOM requests the model could serve
    states: dict[int, list[SegmentInfo]]  # the allocator's state after the events asked for
    fidelity: Fidelity | None
    warnings: list[str]
    replayed_until: int = -1  # the last event replayed; the timelines carry its state on
    # Per event: the size of the block the model handed out for an ALLOC
    # (rounding and any unsplit remainder included); 0 elsewhere and for
    # ALLOCs not replayed.
    block_sizes: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

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


def oom_record(dev: DeviceAllocator, i: int, size: int, stream: int, recorded: bool,
                earlier: list[OomRecord]) -> OomRecord:
    # Keep the allocator's state for the first few failures only: a replay
    # that runs out everywhere would otherwise hold a copy per request.
    state = segments(dev) if len(earlier) < 3 else []
    return OomRecord(i, dev.device, size, round_size(size, dev.config.roundup_power2_divisions), stream, recorded,
                     dev.reserved, dev.allocated, dev.active, dev.capacity, dev.allowed, state)
