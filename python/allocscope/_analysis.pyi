"""allocscope's replay in C++ (csrc/replay*.cpp). Private: use allocscope.allocator.replay."""

from typing import Any

import numpy as np

def replay(config: tuple, faithful: bool, synthetic_start: int, devices: list[tuple], kind: np.ndarray,
           addr: np.ndarray, size: np.ndarray, block: np.ndarray, arg: np.ndarray, stream: np.ndarray,
           deferred: np.ndarray, stream_device: list[int], stream_handle: list[int], states_at: list[int],
           stop_after: int) -> dict[str, Any]:
    """Replays the capture's requests through the model (allocator/native.py converts in and out)."""
