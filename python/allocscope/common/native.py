"""Loading the native code on first use (nothing happens at import time).

Recording needs torch and its extension, allocscope._C (native()).
Reading and analysing captures needs neither: where allocscope._analysis
(the analysis' hot loops, no torch) is built they use it, and otherwise the
Python code it follows (analysis()).
"""

from __future__ import annotations

import functools
from types import ModuleType

from .errors import InputError

__all__ = ["analysis", "analysis_for", "native", "NativeUnavailableError"]


class NativeUnavailableError(InputError, RuntimeError):
    """The compiled extension (allocscope._C) or torch cannot be imported."""


@functools.lru_cache(maxsize=None)
def native() -> ModuleType:
    try:
        import torch  # noqa: F401  (loads the libraries _C links against)
    except ImportError as e:
        raise NativeUnavailableError(f"recording needs torch, which cannot be imported: {e}") from None
    try:
        from .. import _C
    except ImportError as e:
        raise NativeUnavailableError(
            f"allocscope's extension is not built for this torch ({e}); "
            "build it with: pip install --no-build-isolation -e .") from None
    return _C


def analysis_for(engine: str, reference: str) -> ModuleType | None:
    """allocscope._analysis where `engine` ("auto", "native" or the name of
    the reference implementation) asks for it and it is built; None: use the
    reference. ValueError for an unknown engine, or "native" not built."""
    if engine not in ("auto", "native", reference):
        raise InputError(f"unknown engine {engine!r} (auto, native, {reference})")
    fast = analysis() if engine != reference else None
    if engine == "native" and fast is None:
        raise InputError("allocscope._analysis is not built")
    return fast


@functools.lru_cache(maxsize=None)
def analysis() -> ModuleType | None:
    """allocscope._analysis, or None where it is not built."""
    try:
        from .. import _analysis  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _analysis
