"""A model of PyTorch's CUDA caching allocator, usable on its own: no
attribution, no reports. It reads captures (reader.py) and nothing above.

sizes: c10's constants, request rounding and segment sizes. config:
PYTORCH_CUDA_ALLOC_CONF parsing and the settings a capture ran with.
blocks, model, expandable: the allocator itself (DeviceAllocator).
segments: typed segment and block records, and the one reader of a
baseline's segments. state: listing and loading an allocator's state.
replay: a capture's requests through the model, checked against the
recording. fragmentation: figures about one state. whatif: other
settings, smaller cards, ranked suggestions.
"""

from .config import AllocatorConfig, ConfigError, parse_alloc_conf, recorded_config
from .fragmentation import figures, stranded
from .model import DeviceAllocator, free_block_order
from .recorded import Fidelity, deferred_frees, recorded_reserved
from .replay import NotACudaCapture, OomRecord, Replay, replay
from .segments import BlockInfo, SegmentInfo, baseline_segments
from .sizes import allocation_size, round_size, round_sizes
from .state import segments
from .whatif import Outcome, outcome, suggest

__all__ = ["AllocatorConfig", "BlockInfo", "ConfigError", "DeviceAllocator", "Fidelity", "NotACudaCapture",
           "OomRecord", "Outcome", "Replay", "SegmentInfo", "allocation_size", "baseline_segments", "deferred_frees",
           "figures", "free_block_order", "outcome", "parse_alloc_conf", "recorded_config", "recorded_reserved",
           "replay", "round_size", "round_sizes", "segments", "stranded", "suggest"]
