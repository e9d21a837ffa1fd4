"""Run code right after the process imports torch, without importing it.

Processes started by `allocscope run` (recording) and on the virtual GPU
(turning cuDNN off) need to act once torch is loaded but before the program
uses it; importing torch themselves would load it earlier than the program
does, and initialize things the program may configure first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Callable

__all__ = ["after_torch_import"]

_callbacks: list[Callable[[], None]] = []


def _run_callbacks() -> None:
    while _callbacks:
        callback = _callbacks.pop(0)
        try:
            callback()
        except Exception as e:  # never break the program's import of torch
            print(f"allocscope: {e}", file=sys.stderr)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_run(module: Any) -> None:
            exec_module(module)
            _run_callbacks()

        loader.exec_module = exec_then_run  # type: ignore[method-assign]
        return spec


def after_torch_import(callback: Callable[[], None]) -> None:
    """Calls `callback` once torch is imported: now if it already is, else
    right after the process imports it. Callbacks run in the order given; an
    exception in one is printed, not raised."""
    _callbacks.append(callback)
    if "torch" in sys.modules:
        _run_callbacks()
    elif not any(isinstance(f, _TorchImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportHook())
