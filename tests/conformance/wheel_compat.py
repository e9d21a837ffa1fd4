"""A pytest plugin for make conformance's module suites (-p wheel_compat,
every mode): what PyTorch's 2.6 tests need that the installed torch wheel
lacks, so that their files import and their classes set up at all.

- Names the 2.6 tests import that a newer torch removed, put back: a test
  that calls one fails in every mode, saying so (known_failures.txt: the
  2.6 tests' age); a flag that decided which tests run says False, and a
  decorator that set a precision for one test leaves it as it is.
- libtorchbind_test.so, a library PyTorch's CI builds for its tests and the
  wheels do not ship: TestFX's setUp loads it, so without it none of
  TestFX's tests ran. Loading it does nothing where it is missing; the
  tests that use its classes fail in every mode."""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any, Callable


def _removed(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is not in this torch (the 2.6 tests' age)")

    return call


# (module, name, what stands in for it)
MISSING = [("torch.export", "export_for_training", "function"),
           ("torch.testing._internal.common_nn", "new_module_tests", "list"),
           ("torch.testing._internal.common_cuda", "tf32_is_not_fp32", "false"),
           ("torch.testing._internal.common_mkldnn", "bf32_on_and_off", "decorator")]
STANDINS: dict[str, Callable[[str], Any]] = {
    "list": lambda name: [],
    "false": lambda name: (lambda *a, **k: False),
    "decorator": lambda name: (lambda *a, **k: (lambda f: f)),
    "function": _removed,
}


def pytest_configure(config: Any) -> None:
    for module, name, kind in MISSING:
        m = importlib.import_module(module)
        if not hasattr(m, name):
            setattr(m, name, STANDINS[kind](f"{module}.{name}"))
    import torch

    load_library = torch.ops.load_library

    @functools.wraps(load_library)
    def load_library_if_there(path: Any) -> None:
        if str(path).endswith("libtorchbind_test.so") and not os.path.exists(str(path)):
            return
        load_library(path)

    torch.ops.load_library = load_library_if_there
