"""The user's line of a recorded Python stack: the innermost frame outside
torch and allocscope, which is where an allocation "comes from" in every
report (sites, OOM requests, the blocks that pin a segment)."""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

__all__ = ["is_library", "site", "stacks_through", "user_frame"]

# Installed packages: the package is the folder right after the last
# site-packages/dist-packages (a venv may itself live in a folder named
# torch: /opt/torch/.venv/.../site-packages/transformers/ is transformers').
_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)")
# Elsewhere (a source checkout, an editable install): any folder so named.
_IN_PLACE = re.compile(r"[/\\](torch|allocscope)[/\\]")
_LIBRARIES = ("torch", "allocscope")


def is_library(filename: str) -> bool:
    """Whether a frame's file is torch's, allocscope's or Python's import
    machinery: not the user's code (the same rule as user_frame's)."""
    if filename.startswith("<frozen "):
        return True
    installed = _INSTALLED.findall(filename)
    if installed:
        return installed[-1] in _LIBRARIES
    return _IN_PLACE.search(filename) is not None


def user_frame(cap: Any, stack_id: int) -> tuple[str, str, int] | None:
    """(file, function, line) of the innermost frame of a stack outside torch
    and allocscope (the user's line), else the innermost frame; None for an
    empty stack. cap: a reader.Capture."""
    frames = cap.stack(stack_id)
    for f in frames:
        if not is_library(f.filename):
            return f.filename, f.function, f.line
    return (frames[0].filename, frames[0].function, frames[0].line) if frames else None


def site(cap: Any, stack_id: int) -> str | None:
    """The user's line of a stack as 'file:line (function)', None for an empty stack."""
    f = user_frame(cap, stack_id)
    return f"{f[0]}:{f[2]} ({f[1]})" if f else None


def stacks_through(cap: Any, frame_matches: Callable[[str, str], bool]) -> np.ndarray:
    """Per stack node: whether any frame of its stack (the node's or a
    caller's) matches, frame_matches(filename, function)."""
    n = len(cap.stack_parent)
    frames = cap.stack_frame.astype(np.int64)
    present = np.unique(frames[1:]).tolist() if n > 1 else []
    hits = [f for f in present
            if frame_matches(cap.strings[cap.frame_file[f]], cap.strings[cap.frame_function[f]])]
    flag = np.isin(frames, np.array(hits, np.int64))
    if n:
        flag[0] = False  # node 0: the empty stack
    up = cap.stack_parent.astype(np.int64)
    # Pointer jumping: after round k a node has looked 2^k callers up.
    while flag.any() and up.any():
        flag = flag | flag[up]
        up = up[up]
    return flag
