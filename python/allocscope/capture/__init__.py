"""The capture file: its format (format.py, the numbers of csrc/format/format.h;
codec.py, the columns' encodings), reading it (reader.py: allocscope.load;
decode.py, events chunks into columns; baselines.py, what its baselines say of
the device: memory outside the allocator, NCCL's), writing it from Python (writer.py:
imports, tests, synthetic captures; the recorder writes in C++), and the
user's line of a recorded stack (stacks.py). Needs neither torch nor the
native extensions, and reading a file never runs code from it."""

from .format import EventKind
from .reader import (Capture, CaptureError, CorruptCaptureError, Events, Frame, NotACaptureError,
                     TruncatedCaptureWarning, UnsupportedVersionError, load)

__all__ = ["Capture", "CaptureError", "CorruptCaptureError", "EventKind", "Events", "Frame", "NotACaptureError",
           "TruncatedCaptureWarning", "UnsupportedVersionError", "load"]
