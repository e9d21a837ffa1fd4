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
``allocscope.fit(["python", "train.py"], ["A100-40GB"])`` runs a command on
virtual cards and says whether it fits on each (``allocscope fit``).

Importing allocscope does nothing else: torch and the native core load on
first use, and reading captures needs neither.
"""

from typing import TYPE_CHECKING, Any

from . import vgpu
from ._version import __version__
from .capture import (Capture, CaptureError, CorruptCaptureError, EventKind, Events, Frame, NotACaptureError,
                      TruncatedCaptureWarning, UnsupportedVersionError, load)
from .common.errors import InputError
from .recording import AllocscopeError, Recording, Watch, mark, record, watch

if TYPE_CHECKING:
    from .harness.fit import fit

# Names served from the harness on first use: it runs programs and builds
# reports, which a recording script or a capture reader never needs.
_LAZY = {"fit": "allocscope.harness.fit"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module 'allocscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext allocscope` in IPython or Jupyter: the %%allocscope cell
    magic (allocscope.harness.notebook)."""
    from .harness.notebook import register_magics

    register_magics(ipython)


__all__ = [
    "AllocscopeError",
    "Capture",
    "CaptureError",
    "CorruptCaptureError",
    "EventKind",
    "Events",
    "Frame",
    "InputError",
    "NotACaptureError",
    "Recording",
    "TruncatedCaptureWarning",
    "UnsupportedVersionError",
    "Watch",
    "__version__",
    "fit",
    "load",
    "load_ipython_extension",
    "mark",
    "record",
    "vgpu",
    "watch",
]
