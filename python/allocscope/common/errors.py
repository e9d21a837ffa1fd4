"""The one exception type for bad input.

Bad input is what the user gave, or asked for, that cannot be used: a file
that is not a readable capture, an argument or setting out of range, a GPU
model that does not exist, an output that would be overwritten, a command
that cannot run, CUDA or the extension where they are missing. The command
line prints an InputError's message as one line and exits 2 (cli/); any
other exception is a bug of allocscope's and keeps its traceback.

InputError is a ValueError, so that callers who caught ValueError for bad
arguments still do; the error types of the layers that meet bad input
(CaptureError, VirtualGpuError, ConfigError, ...) derive from it.
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """What the user gave or asked for cannot be used; the message says why, in one line."""
