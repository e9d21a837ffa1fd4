"""Imported at startup by Python processes run under `allocscope run` or on
the virtual GPU (allocscope.vgpu.environment).

This folder is first on PYTHONPATH, so this module shadows any other
sitecustomize: load that one too, then switch the virtual GPU on if asked
(before anything can import torch), then arm recording if asked (see
allocscope.recording.autostart).
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _arm() -> None:
    try:
        from allocscope import vgpu
        from allocscope.recording import autostart, limits
    except ImportError as e:
        print(f"allocscope: not active in this process ({sys.executable}): cannot import allocscope: {e}",
              file=sys.stderr)
        return
    vgpu.activate_from_environment()
    autostart.activate()
    limits.watch_from_environment()


_run_shadowed_sitecustomize()
_arm()
