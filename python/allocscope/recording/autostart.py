"""Recording in processes started by `allocscope run`.

`allocscope run` puts bootstrap/ first on PYTHONPATH (child_environment), so every Python process
of the command imports its sitecustomize, which calls activate(). That
installs an import hook: when the process imports torch, recording starts
(CPU), or is set to start when CUDA initializes (CUDA), so that CUDA is never
initialized earlier than the program itself would. The recording stops at
interpreter exit (atexit), at os._exit (multiprocessing's forked children
leave that way; exits.py), on SIGTERM (recorder.cpp), or on an exception that
ends the program. Processes that never import torch record nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Mapping

from ..common.startup import with_bootstrap
from ..common.torch_hook import after_torch_import
from .exits import at_process_exit

__all__ = ["ENV_OPTIONS", "ENV_OUTPUT", "activate", "child_environment", "output_path"]

ENV_OUTPUT = "ALLOCSCOPE_RUN_OUTPUT"
ENV_OPTIONS = "ALLOCSCOPE_RUN_OPTIONS"


def child_environment(base: Mapping[str, str], output: str, options: dict[str, Any]) -> dict[str, str]:
    env = dict(base)
    env[ENV_OUTPUT] = output
    env[ENV_OPTIONS] = json.dumps(options)
    return with_bootstrap(env)


def output_path(base: str) -> str:
    """The file this process writes: FILE for the first process of the run,
    FILE with .rankN (torchrun's rank N) or .pidN added for the others.

    Each name is claimed by the first process that asks for it: a rank's
    own Python children (Inductor's compile workers, a data loader's
    spawned workers) inherit its RANK, and would otherwise write into the
    rank's file while it is being written."""
    stem, ext = os.path.splitext(base)
    rank = os.environ.get("RANK")
    if rank is not None and rank.isdigit() and os.environ.get("WORLD_SIZE", "1") != "1":
        first = f"{stem}.rank{rank}{ext}"
    else:
        first = base
    try:
        os.close(os.open(first, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return first
    except FileExistsError:
        return f"{stem}.pid{os.getpid()}{ext}"


def _start(options: dict[str, Any]) -> None:
    from .session import Recording

    path = output_path(os.environ[ENV_OUTPUT])
    # A helper process (Inductor's compile workers, a launcher) that never
    # holds memory leaves no file, however it ends (the recorder removes
    # it: SIGTERM at a launcher's teardown ends it in C). A rank's file
    # stays: the report across ranks counts them.
    helper = path != os.environ[ENV_OUTPUT] and os.path.splitext(path)[0].endswith(f".pid{os.getpid()}")
    rec = Recording(path, device=options.get("device", "cpu"), stacks=options.get("stacks", "python"),
                    ops=options.get("ops"), _remove_if_unused=helper)
    try:
        rec.start()
        if options.get("auto_watch"):
            rec.auto_watch()
    except Exception as e:  # never break the program being recorded
        print(f"allocscope: could not start recording: {e}", file=sys.stderr)
        if not rec.active:  # (the name this process claimed: nothing in it)
            with contextlib.suppress(OSError):
                if os.path.getsize(path) == 0:
                    os.remove(path)
        return

    def _report(how: str) -> None:
        summary = rec.stop(how)
        if summary and not summary.get("removed"):
            print(f"allocscope: recorded {summary.get('events', 0):,} events into {path}", file=sys.stderr)

    at_process_exit(_report)


def _on_torch_imported(options: dict[str, Any]) -> None:
    try:
        if options.get("device") == "cuda":
            import torch.cuda

            # Runs inside torch.cuda's lazy initialization, right after CUDA is
            # up (or now, if it already is). An exception there would break
            # the program's CUDA init: _start swallows its own.
            torch.cuda._lazy_call(lambda: _start(options) if not _defer_to_set_device() else None)
            _wrap_set_device(torch, options)
        else:
            _start(options)
    except Exception as e:
        print(f"allocscope: could not start recording: {e}", file=sys.stderr)


# While torch.cuda.set_device initializes CUDA: recording starts once the
# device is set. Starting inside the initialization (before the device is
# set) would read the memory of the device current then (0) and so create a
# CUDA context there, hundreds of MiB on a card the process never uses: the
# very "GPU 0 fuller than the others" the report across ranks points at.
_set_device_pending: dict[str, bool] = {}


def _defer_to_set_device() -> bool:
    if _set_device_pending.get("inside"):
        _set_device_pending["deferred"] = True
        return True
    return False


def _wrap_set_device(torch: Any, options: dict[str, Any]) -> None:
    import functools

    original = torch.cuda.set_device

    @functools.wraps(original)
    def set_device(device: Any) -> None:
        if torch.cuda.is_initialized() or _set_device_pending.get("done"):
            return original(device)
        _set_device_pending["inside"] = True
        try:
            original(device)
        finally:
            _set_device_pending["inside"] = False
            _set_device_pending["done"] = True
        if _set_device_pending.pop("deferred", False):
            _start(options)

    torch.cuda.set_device = set_device


def activate() -> None:
    if not os.environ.get(ENV_OUTPUT):
        return
    try:
        options = json.loads(os.environ.get(ENV_OPTIONS, "{}"))
    except ValueError:
        options = {}
    after_torch_import(lambda: _on_torch_imported(options))
