"""allocscope's analysis hot loops in C++ (csrc/replay*.cpp, scopes.cpp, pairs.cpp, decode.cpp); no torch.
Private: use allocscope.allocator.replay, attribution.lifetimes / scopes, allocator.recorded, allocscope.load."""

from typing import Any

import numpy as np

def replay(config: tuple, faithful: bool, synthetic_start: int, devices: list[tuple], kind: np.ndarray,
           addr: np.ndarray, size: np.ndarray, block: np.ndarray, arg: np.ndarray, stream: np.ndarray,
           deferred: np.ndarray, stream_device: list[int], stream_handle: list[int], states_at: list[int],
           stop_after: int) -> dict[str, Any]:
    """Replays the capture's requests through the model (allocator/native.py converts in and out)."""
def walk_scopes(events: np.ndarray, threads: np.ndarray, symbols: np.ndarray, table: list[tuple[bool, int, bool]],
                names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(event, thread, innermost name) where a thread's innermost module scope changed (attribution/scopes.py)."""
def lifetimes(kind: np.ndarray, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(allocs, their frees or -1, unmatched frees, double allocs), events in sequence order."""
def deferred_frees(kind: np.ndarray, addr: np.ndarray, pending_at_end: list[int]) -> np.ndarray:
    """Per event (uint8): a FREE that waited for another stream."""
def decode_events(payload: Any, version: int, columns: dict[str, np.ndarray], at: int) -> tuple[int, int]:
    """Decodes one EVENTS payload into rows at.. of the columns (_decode.py); (count, first_seq).
    FormatError (a ValueError) where the payload does not follow the format."""

class FormatError(ValueError): ...
