"""The environment of a child process that runs CUDA under one allocator
setting: torch reads PYTORCH_CUDA_ALLOC_CONF (or its newer name,
PYTORCH_ALLOC_CONF) once, when CUDA initializes, so a setting is tried in a
process of its own."""

from __future__ import annotations

import os
from typing import Mapping

__all__ = ["with_alloc_conf"]

ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def with_alloc_conf(conf: str = "", base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with PYTORCH_CUDA_ALLOC_CONF
    set to `conf`, or unset for torch's defaults when `conf` is empty."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in ALLOC_CONF_VARS}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return env
