"""Output paths of the commands that write a file (html, diff --html, export,
import): the default name and the refusal to overwrite without -f."""

from __future__ import annotations

import os

from ..common.errors import InputError

__all__ = ["check_output", "default_output"]


def default_output(path: str, suffix: str) -> str:
    """The input's name with its extension replaced (step.alsc -> step.html)."""
    root, ext = os.path.splitext(path)
    return (root if ext else path) + suffix


def check_output(path: str, force: bool) -> None:
    """Refuses to overwrite an existing file unless forced (-f)."""
    if os.path.exists(path) and not force:
        raise InputError(f"{path} exists (use -f to overwrite)")
