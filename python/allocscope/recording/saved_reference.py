"""The saved-tensor hook in Python, as the watcher ran it before the C++ one
(csrc/recorder/saved.h) replaced it: the reference that one is tested and
timed against."""

from __future__ import annotations

from typing import Any

from ..capture.format import EventKind
from ..common.native import native
from .watcher import Watch

__all__ = ["PythonSavedTensorLabeler"]


class PythonSavedTensorLabeler:
    """The saved-tensor hook in Python, as the watcher ran it before the C++
    one (csrc/recorder/saved.h, native SavedTensorLabeler) replaced it: the
    reference that one is tested against (tests/integration/test_watch_saved.py)
    and timed against (benchmarks/bench_saved_hook.py; bench_step.py's
    allocscope-watch-pypack)."""

    def __init__(self, watch: "Watch"):
        self._watch, self._labelled = watch, set()
        self._parameters = set(watch._param_storages)

    def set_parameters(self, storages: list[int]) -> None:
        self._parameters = set(storages)

    def begin_forward(self) -> None:
        self._labelled = set(self._parameters)

    def close(self) -> None:
        """(no engine route to release: the C labeler's close())"""

    def pack(self, t: Any) -> Any:
        w = self._watch
        if not (("cuda" in w._device_types and t.is_cuda) or ("cpu" in w._device_types and t.is_cpu)):
            return t.detach()
        try:
            ptr = t.data_ptr() - t.storage_offset() * t.element_size()
        except (RuntimeError, NotImplementedError, TypeError):  # no storage: nothing to label
            ptr = 0
        if ptr and ptr not in self._labelled:
            self._labelled.add(ptr)
            try:
                size = t.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError, TypeError):
                size = 0
            w._annotate(int(EventKind.ACTIVATION), native().innermost_module(w.name), ptr, size, False)
        return t.detach()

    @staticmethod
    def unpack(t: Any) -> Any:
        return t
