"""Recording in processes started by `allocscope run`.

`allocscope run` puts _bootstrap/ first on PYTHONPATH, so every Python process
of the command imports its sitecustomize, which calls activate(). That
installs an import hook: when the process imports torch, recording starts
(CPU), or is set to start when CUDA initializes (CUDA), so that CUDA is never
initialized earlier than the program itself would. The recording stops at
interpreter exit (atexit), on SIGTERM (recorder.cpp), or on an exception that
ends the program. Processes that never import torch record nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from typing import Any, Mapping

ENV_OUTPUT = "ALLOCSCOPE_RUN_OUTPUT"
ENV_OPTIONS = "ALLOCSCOPE_RUN_OPTIONS"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def child_environment(base: Mapping[str, str], output: str, options: dict[str, Any]) -> dict[str, str]:
    env = dict(base)
    env[ENV_OUTPUT] = output
    env[ENV_OPTIONS] = json.dumps(options)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + path if path else "")
    return env


def output_path(base: str) -> str:
    """The file this process writes: FILE for the first process of the run,
    FILE with .rankN (torchrun) or .pidN added for the others."""
    stem, ext = os.path.splitext(base)
    rank = os.environ.get("RANK")
    if rank is not None and rank.isdigit() and os.environ.get("WORLD_SIZE", "1") != "1":
        return f"{stem}.rank{rank}{ext}"
    try:
        os.close(os.open(base, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))  # claim FILE
        return base
    except FileExistsError:
        return f"{stem}.pid{os.getpid()}{ext}"


def _start(options: dict[str, Any]) -> None:
    from .capture import Recording

    path = output_path(os.environ[ENV_OUTPUT])
    rec = Recording(path, device=options.get("device", "cpu"), stacks=options.get("stacks", "python"))
    try:
        rec.start()
    except Exception as e:  # never break the program being recorded
        print(f"allocscope: could not start recording: {e}", file=sys.stderr)
        return

    import atexit

    def _report() -> None:
        summary = rec.stop("exit")
        if summary:
            print(f"allocscope: recorded {summary.get('events', 0):,} events into {path}", file=sys.stderr)

    atexit.register(_report)


def _on_torch_imported(options: dict[str, Any]) -> None:
    if options.get("device") == "cuda":
        import torch.cuda

        # Runs inside torch.cuda's lazy initialization, right after CUDA is up
        # (or now, if it already is). An exception there would break the
        # program's CUDA init: _start swallows its own.
        torch.cuda._lazy_call(lambda: _start(options))
    else:
        _start(options)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, options: dict[str, Any]):
        self.options = options

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        options = self.options

        def exec_then_start(module: Any) -> None:
            exec_module(module)
            try:
                _on_torch_imported(options)
            except Exception as e:
                print(f"allocscope: could not start recording: {e}", file=sys.stderr)

        loader.exec_module = exec_then_start  # type: ignore[method-assign]
        return spec


def activate() -> None:
    if not os.environ.get(ENV_OUTPUT):
        return
    try:
        options = json.loads(os.environ.get(ENV_OPTIONS, "{}"))
    except ValueError:
        options = {}
    if "torch" in sys.modules:
        _on_torch_imported(options)
    else:
        sys.meta_path.insert(0, _TorchImportHook(options))
