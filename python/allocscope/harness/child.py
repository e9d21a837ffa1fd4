"""Running the user's command as a child process (run, fit): the command
line as given (python implied for a script), and waiting for it while the
terminal's Ctrl-C reaches the child alone and SIGTERM is passed on, so that
its capture is finished."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
from typing import Sequence

from ..common.errors import InputError

__all__ = ["command_line", "outputs", "wait_for"]


def command_line(command: Sequence[str], usage: str) -> list[str]:
    """The command to run, as given after `--` (a leading `--` is dropped; a
    script runs with this Python); usage: the example the error shows."""
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise InputError(f"no command given: {usage}")
    if cmd[0].endswith(".py") or cmd[0] == "-m":
        cmd = [sys.executable, *cmd]
    return cmd


def outputs(path: str) -> list[str]:
    """The captures a run writes to `path`: the file itself (the first
    process), then those of other ranks or processes (.rankN, .pidN)."""
    stem, ext = os.path.splitext(path)
    found = [path] if os.path.exists(path) else []
    return found + sorted(glob.glob(f"{glob.escape(stem)}.rank*{ext}") + glob.glob(f"{glob.escape(stem)}.pid*{ext}"))


def wait_for(cmd: list[str], env: dict[str, str], *, output_to_stderr: bool = False) -> int:
    """Runs cmd to its end; its exit status (128 + N for a signal N).
    output_to_stderr: the child's standard output goes to our standard error
    (so that ours holds only what we print, e.g. JSON)."""
    try:
        child = subprocess.Popen(cmd, env=env, stdout=sys.stderr if output_to_stderr else None)
    except OSError as e:
        raise InputError(f"cannot run {cmd[0]}: {e.strerror}") from None
    # The terminal sends Ctrl-C to the child too; let it finish its capture.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
    previous_term = signal.signal(signal.SIGTERM, forward)
    try:
        status = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
    return status if status >= 0 else 128 - status
