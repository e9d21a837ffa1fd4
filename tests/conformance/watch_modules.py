"""A pytest plugin for make conformance's module suites (-p watch_modules,
under `allocscope run`): every nn.Module is watched (allocscope.watch) as
soon as it is built, so that PyTorch's tests of hooks, state dicts,
serialization and tracing meet watched modules whether or not they call
them (`fit` and `run` watch a model at its first call).

A module is built when its outermost __init__ returns (a subclass's
__init__ calls nn.Module.__init__ first, then makes its parameters and
children): nn.Module.__init__ finds that frame (the chain of __init__ frames
of the same object) and a profile function, set on this thread only while
a construction is under way, watches the module when that frame returns.
The harness's own change (nn.Module.__init__ wrapped, the profile function
during constructions) is the one thing this mode adds beyond allocscope.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any

import torch

import allocscope

_local = threading.local()
_original_init = torch.nn.Module.__init__
_failures: list[str] = []


def _watch(module: Any) -> None:
    try:
        allocscope.watch(module)
    except Exception as e:  # (reported at the end: a module this harness could not watch)
        _failures.append(f"{type(module).__name__}: {type(e).__name__}: {e}")


def _profile(frame: Any, event: str, arg: Any) -> None:
    armed = _local.armed
    if event == "return" and armed and armed[-1][0] is frame:
        _, ref = armed.pop()
        module = ref()
        if module is not None:
            _watch(module)
        if not armed:
            sys.setprofile(_local.previous)


@functools.wraps(_original_init)
def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    outer = None
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is self:
        outer, frame = frame, frame.f_back
    if outer is None:  # nn.Module() itself: built already
        _watch(self)
        return
    armed = getattr(_local, "armed", None)
    if armed is None:
        armed = _local.armed = []
    if not armed:
        _local.previous = sys.getprofile()
        sys.setprofile(_profile)
    armed.append((outer, weakref.ref(self)))


def pytest_configure(config: Any) -> None:
    torch.nn.Module.__init__ = _init  # type: ignore[method-assign]


def pytest_unconfigure(config: Any) -> None:
    torch.nn.Module.__init__ = _original_init  # type: ignore[method-assign]
    if _failures:
        print(f"watch_modules: {len(_failures)} modules not watched, e.g. {_failures[0]}", file=sys.stderr)
