"""Loading the native core on first use (nothing happens at import time).

Reading and analysing captures needs neither torch nor the extension; only
recording does.
"""

from __future__ import annotations

import functools
from types import ModuleType


class NativeUnavailableError(RuntimeError):
    """The compiled extension (allocscope._C) or torch cannot be imported."""


@functools.lru_cache(maxsize=None)
def native() -> ModuleType:
    try:
        import torch  # noqa: F401  (loads the libraries _C links against)
    except ImportError as e:
        raise NativeUnavailableError(f"recording needs torch, which cannot be imported: {e}") from None
    try:
        from . import _C
    except ImportError as e:
        raise NativeUnavailableError(
            f"allocscope's extension is not built for this torch ({e}); "
            "build it with: pip install --no-build-isolation -e .") from None
    return _C
