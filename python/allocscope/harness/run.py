"""`allocscope run` as a Python call: a command run with recording on in
every Python process it starts that uses torch (recording/autostart.py), on
this machine's device or on a virtual GPU, or on a virtual GPU alone."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from ..common.errors import InputError
from .child import command_line, outputs, wait_for

__all__ = ["RunResult", "run_command"]


@dataclasses.dataclass(frozen=True)
class RunResult:
    status: int  # the command's exit status (128 + N for a signal N)
    captures: list[str]  # the captures written: the first process's, then .rankN / .pidN
    device: str | None  # the device recorded ("cuda", "cpu"), None when not recording


def run_command(command: Sequence[str], output: str | None, *, gpu: str | None = None, gpu_memory: str | None = None,
                device: str = "auto", stacks: str = "python", force: bool = False) -> RunResult:
    """Runs `command` (a script runs with this Python) to its end, recording
    into `output` (None: not recorded, only on a virtual GPU), on a virtual
    GPU of model `gpu` (with `gpu_memory` instead of the preset's) or on
    this machine's `device` ("auto": CUDA where torch has it). The captures
    written are `output` for the first process, with .rankN or .pidN added
    for the others. InputError for bad input (no command, an unknown GPU,
    `output` in the way without force)."""
    from .. import vgpu
    from ..recording.autostart import child_environment

    cmd = command_line(command, "allocscope run -o FILE -- python script.py")
    env = dict(os.environ)
    if gpu:
        if device == "cpu":
            raise InputError("--gpu runs on a virtual CUDA device, which --device cpu would not record: leave it out")
        env = vgpu.environment(gpu, memory=gpu_memory, base=env)
    elif output is None:
        raise InputError("a run without recording is a run on a virtual GPU: give --gpu")
    if output is None:
        return RunResult(wait_for(cmd, env), [], None)
    path = os.path.abspath(output)
    if outputs(path):
        if not force:
            raise InputError(f"{output} exists; use --force to overwrite it")
        for old in outputs(path):
            os.remove(old)
    recorded = "cuda" if gpu else _device(device)
    env = child_environment(env, path, {"device": recorded, "stacks": stacks})
    return RunResult(wait_for(cmd, env), outputs(path), recorded)


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch
    except ImportError:
        raise InputError("torch cannot be imported here; allocscope run needs it") from None
    return "cuda" if torch.cuda.is_available() else "cpu"
