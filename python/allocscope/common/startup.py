"""Where a child process's start-up hook lives, and the environment that
makes a child's interpreter run it.

The hook (allocscope/bootstrap/sitecustomize.py) imports the virtual GPU and
the recorder, which sit above this layer: this module names its folder by
path and never imports it.
"""

from __future__ import annotations

import os

__all__ = ["BOOTSTRAP_DIR", "with_bootstrap"]

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bootstrap")


def with_bootstrap(env: dict[str, str]) -> dict[str, str]:
    """env with the hook's folder first on PYTHONPATH (once)."""
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *path])
    return env
