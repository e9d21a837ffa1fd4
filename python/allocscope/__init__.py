"""allocscope: byte-for-byte attribution of PyTorch memory.

Record:

    import allocscope
    with allocscope.record("step.alsc"):
        train_one_step()

or, without touching the script: ``allocscope run -o step.alsc -- python train.py``.

Read: ``allocscope.load("step.alsc")`` returns the events as numpy columns with
their stacks, the allocator baselines and the metadata; ``allocscope info``
and ``allocscope dump`` show them on the command line.

Without a GPU, ``allocscope.vgpu`` runs torch's real CUDA caching allocator on a
virtual card of a chosen model (``allocscope run --gpu H100-80GB``).

Importing allocscope does nothing else: torch and the native core load on
first use, and reading captures needs neither.
"""

from . import vgpu
from ._format import EventKind
from ._version import __version__
from .recording import AllocscopeError, Recording, mark, record, watch
from .watcher import Watch
from .reader import (
    Capture,
    CaptureError,
    CorruptCaptureError,
    Events,
    Frame,
    NotACaptureError,
    TruncatedCaptureWarning,
    UnsupportedVersionError,
    load,
)


__all__ = [
    "AllocscopeError",
    "Capture",
    "CaptureError",
    "CorruptCaptureError",
    "EventKind",
    "Events",
    "Frame",
    "NotACaptureError",
    "Recording",
    "TruncatedCaptureWarning",
    "UnsupportedVersionError",
    "Watch",
    "__version__",
    "load",
    "mark",
    "record",
    "vgpu",
    "watch",
]
