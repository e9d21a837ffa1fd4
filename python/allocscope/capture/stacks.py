"""The user's line of a recorded Python stack: the innermost frame outside
torch and allocscope, which is where an allocation "comes from" in every
report (sites, OOM requests, the blocks that pin a segment)."""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

__all__ = ["folded_stack", "frame_runs", "is_library", "library_of", "package_of", "site", "stacks_through", "user_frame"]

# Installed packages: the package is the folder right after the last
# site-packages/dist-packages (a venv may itself live in a folder named
# torch: /opt/torch/.venv/.../site-packages/transformers/ is transformers').
_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)")
# Elsewhere (a source checkout, an editable install): any folder so named.
_IN_PLACE = re.compile(r"[/\\](torch|allocscope)[/\\]")
_LIBRARIES = ("torch", "allocscope")


def library_of(filename: str) -> str | None:
    """The library a frame's file is part of: "torch", "allocscope", or
    "python" (its import machinery); None for the user's code."""
    if filename.startswith("<frozen "):
        return "python"
    installed = _INSTALLED.findall(filename)
    if installed:
        return installed[-1] if installed[-1] in _LIBRARIES else None
    m = _IN_PLACE.search(filename)
    return m.group(1) if m else None


def is_library(filename: str) -> bool:
    """Whether a frame's file is torch's, allocscope's or Python's import
    machinery: not the user's code (the same rule as user_frame's)."""
    return library_of(filename) is not None


def package_of(filename: str) -> str | None:
    """The installed package a frame's file is part of (any package under
    site-packages: torch, transformers, IPython, ...), torch or allocscope
    run in place, or "python" for the import machinery; None for the user's
    own code (a script, a repository, a notebook's cell)."""
    installed = _INSTALLED.findall(filename)
    return installed[-1] if installed else library_of(filename)


def frame_runs(frames: list[Any], key: Callable[[Any], str | None]) -> list[list[Any]]:
    """Consecutive frames with the same key (not None) grouped into runs;
    each frame whose key is None alone."""
    runs: list[list[Any]] = []
    for f in frames:
        k = key(f)
        if k is not None and runs and key(runs[-1][0]) == k:
            runs[-1].append(f)
        else:
            runs.append([f])
    return runs


def folded_stack(frames: list[Any]) -> list[str]:
    """A stack (frames innermost first) as its user reads it: their own
    frames, innermost first, with each run of one package's frames between
    them as one line ("[+3 torch frames]"); the frames the innermost of
    theirs called into go in one line after it, which names the innermost
    frame of all. A stack with none of the user's frames starts at its
    innermost frame."""
    if not frames:
        return []
    head = next((i for i, f in enumerate(frames) if package_of(f.filename) is None), 0)
    lines = [str(frames[head])]
    inside = frames[:head]
    if inside:
        counts: dict[str, int] = {}
        for f in inside:
            package = package_of(f.filename) or "?"
            counts[package] = counts.get(package, 0) + 1
        what = (_frames(len(inside), next(iter(counts))) if len(counts) == 1 else
                f"{len(inside)} frames ({', '.join(f'{n} {p}' for p, n in counts.items())})")
        lines.append(f"[+{what} inside, innermost {inside[0]}]")
    for run in frame_runs(frames[head + 1:], lambda f: package_of(f.filename)):
        package = package_of(run[0].filename)
        lines.append(str(run[0]) if package is None else f"[+{_frames(len(run), package)}]")
    return lines


def _frames(n: int, package: str | None) -> str:
    return f"{n} {package} frame{'s' if n > 1 else ''}"


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
