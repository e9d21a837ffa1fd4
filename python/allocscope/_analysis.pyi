"""allocscope's analysis hot loops in C++ (csrc/analysis/); no torch.
Private: use allocscope.allocator.replay, attribution.lifetimes / scopes, allocator.recorded, allocscope.load."""

from typing import Any

import numpy as np

class Config:
    """The allocator settings the model follows (keyword arguments only)."""
    def __init__(self, *, max_split_size: int, max_non_split_rounding_size: int, large_segment_size: int,
                 garbage_collection_threshold: float, roundup_power2_divisions: list[int],
                 segment_order: bool) -> None: ...
    max_split_size: int
    max_non_split_rounding_size: int
    large_segment_size: int
    garbage_collection_threshold: float
    roundup_power2_divisions: list[int]
    segment_order: bool

class LoadedBlock:
    def __init__(self, *, addr: int, size: int, requested: int, active: bool, allocated: bool) -> None: ...
    addr: int
    size: int
    requested: int
    active: bool
    allocated: bool

class LoadedSegment:
    def __init__(self, *, addr: int, size: int, stream: int, large: bool, blocks: list[LoadedBlock]) -> None: ...
    addr: int
    size: int
    stream: int
    large: bool
    blocks: list[LoadedBlock]

class DeviceSetup:
    """A device as the replay starts it: memory, cudaMalloc's capacity (-1: unlimited), the fraction's
    limit (-1: none), its start baseline's segments."""
    def __init__(self, *, device: int, total: int, capacity: int, allowed: int,
                 start: list[LoadedSegment]) -> None: ...
    device: int
    total: int
    capacity: int
    allowed: int
    start: list[LoadedSegment]

def replay(config: Config, faithful: bool, synthetic_start: int, devices: list[DeviceSetup], kind: np.ndarray,
           addr: np.ndarray, size: np.ndarray, block: np.ndarray, arg: np.ndarray, stream: np.ndarray,
           deferred: np.ndarray, stream_device: list[int], stream_handle: list[int], states_at: list[int],
           stop_after: int) -> dict[str, Any]:
    """Replays the capture's requests through the model (allocator/native.py converts in and out)."""
def walk_scopes(events: np.ndarray, threads: np.ndarray, symbols: np.ndarray, table: list[tuple[bool, int, bool]],
                names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(event, thread, innermost name) where a thread's innermost module scope changed (attribution/scopes.py)."""
def lifetimes(kind: np.ndarray, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(allocs, their frees or -1, unmatched frees, double allocs), events in sequence order."""
def label_allocs(kind: np.ndarray, addr: np.ndarray, label_idx: np.ndarray) -> np.ndarray:
    """Per label event (increasing indices): the ALLOC position open at its address, -1 freed, -2 none before."""
def label_winners(row: np.ndarray, priority: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels that beat every earlier label of their row, in event order; whether each is its row's last)."""
def deferred_frees(kind: np.ndarray, addr: np.ndarray, pending_at_end: list[int]) -> np.ndarray:
    """Per event (uint8): a FREE that waited for another stream."""
def decode_events(payload: Any, version: int, columns: dict[str, np.ndarray], at: int) -> tuple[int, int]:
    """Decodes one EVENTS payload into rows at.. of the columns (capture/decode.py); (count, first_seq).
    FormatError (a ValueError) where the payload does not follow the format."""

class FormatError(ValueError): ...
