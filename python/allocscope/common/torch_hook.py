"""Run code right after the process imports torch (or another module),
without importing it.

Processes started by `allocscope run` (recording) and on the virtual GPU
(turning cuDNN off) need to act once torch is loaded but before the program
uses it; importing torch themselves would load it earlier than the program
does, and initialize things the program may configure first.

"Imported" means torch's module has executed, not that someone looked for
it: transformers and vLLM call importlib.util.find_spec("torch") before they
import it, and the spec such a probe gets is thrown away. So the finder
stays on sys.meta_path, wrapping the loader of every spec it hands out for
torch, until one of those loaders has run torch's module.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable

__all__ = ["after_import", "after_torch_import"]

_callbacks: dict[str, list[Callable[[], None]]] = {}


def _run_callbacks(module: str) -> None:
    waiting = _callbacks.get(module, [])
    while waiting:
        callback = waiting.pop(0)
        try:
            callback()
        except Exception as e:  # never break the program's import of torch
            print(f"allocscope: {e}", file=sys.stderr)


def _loaded(module: str) -> bool:
    """Whether the module has finished executing (while it executes it is
    in sys.modules already, its spec marked _initializing)."""
    found = sys.modules.get(module)
    if found is None:
        return False
    spec = getattr(found, "__spec__", None)
    return not getattr(spec, "_initializing", False)


class _ImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, module: str) -> None:
        self.module = module

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.module:
            # Loaded without our loader (a finder put before this one after
            # it was installed found it): act at the next import.
            if _callbacks.get(self.module) and _loaded(self.module):
                self._done()
            return None
        spec = self._find_with_the_others(name, path, target)
        loader = getattr(spec, "loader", None) if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None or isinstance(loader, type) or getattr(exec_module, "_allocscope_hook", False):
            return spec

        def exec_then_run(module: Any) -> None:
            exec_module(module)
            if getattr(module, "__name__", None) == self.module:
                # (a loader that serves other modules too: theirs as before)
                if getattr(loader, "__dict__", {}).get("exec_module") is exec_then_run:
                    del loader.exec_module
                self._done()

        exec_then_run._allocscope_hook = True  # type: ignore[attr-defined]
        # An attribute of this loader object (the path finders make one per
        # spec), so that the module's __loader__ stays the loader it would have been.
        try:
            loader.exec_module = exec_then_run
        except (AttributeError, TypeError):  # (a loader with slots: the next import notices torch instead)
            pass
        return spec

    def _find_with_the_others(self, name: str, path: Any, target: Any) -> Any:
        """What the import system would find without this finder (it asks
        the meta path finders in order)."""
        for finder in list(sys.meta_path):
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(name, path, target)
            if spec is not None:
                return spec
        return None

    def _done(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        _run_callbacks(self.module)


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Calls `callback` once `module` (its full name) is imported: now if
    it already is, else right after the process has executed its module
    (however often it looked for it before). Callbacks run in the order
    given; an exception in one is printed, not raised."""
    _callbacks.setdefault(module, []).append(callback)
    if _loaded(module):
        _run_callbacks(module)
    elif not any(isinstance(f, _ImportHook) and f.module == module for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportHook(module))


def after_torch_import(callback: Callable[[], None]) -> None:
    """after_import("torch", callback)."""
    after_import("torch", callback)
