"""The folder `allocscope run` and the virtual GPU put first on a child
process's PYTHONPATH, so that the child imports its sitecustomize.py at
startup (which switches the virtual GPU on and arms recording). This
__init__ only says where the folder is; nothing imports sitecustomize.py
but the child's interpreter."""

from __future__ import annotations

import os

__all__ = ["BOOTSTRAP_DIR", "with_bootstrap"]

BOOTSTRAP_DIR = os.path.dirname(os.path.abspath(__file__))


def with_bootstrap(env: dict[str, str]) -> dict[str, str]:
    """env with this folder first on PYTHONPATH (once)."""
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *path])
    return env
