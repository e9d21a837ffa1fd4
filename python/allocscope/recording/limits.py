"""Bounds on a run (`allocscope run/fit --max-time/--max-events/--max-host-memory`): a dry run whose loop never
ends (a generation loop whose stop flag a kernel was to compute) stops with a one-line message naming where the
program was, instead of running for minutes.

The bounds travel in the environment to every Python process of the run; each process checks its own, from a
daemon thread, four times a second: its time since it started, the events its recording wrote, its resident
memory (where the virtual card's written memory lives). Past one, the message goes to standard error and the
process ends through the exit handlers (exits.py), so its capture is finished (footer reason `limit`), with
status LIMIT_STATUS.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from types import FrameType

__all__ = ["ENV_LIMITS", "LIMIT_STATUS", "Limits", "watch_from_environment", "where_the_program_is"]

ENV_LIMITS = "ALLOCSCOPE_LIMITS"
LIMIT_STATUS = 124  # as timeout(1)'s
POLL_S = 0.25


@dataclass(frozen=True)
class Limits:
    seconds: float | None = None
    events: int | None = None
    host_memory: int | None = None  # bytes

    def any(self) -> bool:
        return any(v is not None for v in (self.seconds, self.events, self.host_memory))

    def to_environment(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @classmethod
    def from_environment(cls, text: str) -> "Limits":
        values = json.loads(text)
        return cls(**{k: values[k] for k in ("seconds", "events", "host_memory") if k in values})


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _events() -> int | None:
    if "allocscope._C" not in sys.modules:  # nothing recorded in this process
        return None
    native = sys.modules["allocscope._C"]
    return int(native.next_seq()) if native.is_active() else None


def _library(filename: str) -> bool:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return ("site-packages" in filename or "dist-packages" in filename or filename.startswith(package)
            or filename.startswith(os.path.dirname(os.__file__)) or filename.startswith("<"))


def where_the_program_is(frame: FrameType | None) -> str:
    """The innermost frame of the program's own code (not a library's, not Python's, not allocscope's): the
    loop it is in. Falls back to the innermost frame."""
    innermost = frame
    while frame is not None:
        if not _library(frame.f_code.co_filename):
            return f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})"
        frame = frame.f_back
    if innermost is None:
        return "an unknown place"
    return f"{innermost.f_code.co_name} ({innermost.f_code.co_filename}:{innermost.f_lineno})"


def _exceeded(limits: Limits, started: float) -> str | None:
    elapsed = time.monotonic() - started
    if limits.seconds is not None and elapsed > limits.seconds:
        return f"ran for {limits.seconds:g} s (--max-time)"
    if limits.events is not None:
        events = _events()
        if events is not None and events > limits.events:
            return f"recorded {events:,} events in {elapsed:.0f} s (--max-events {limits.events:,})"
    if limits.host_memory is not None and _resident_bytes() > limits.host_memory:
        from ..common.units import format_bytes

        return f"held {format_bytes(_resident_bytes())} of host memory (--max-host-memory " \
               f"{format_bytes(limits.host_memory)})"
    return None


def _watch(limits: Limits, started: float, main: int) -> None:
    while True:
        time.sleep(POLL_S)
        why = _exceeded(limits, started)
        if why is None:
            continue
        where = where_the_program_is(sys._current_frames().get(main))
        print(f"allocscope: stopped {os.path.basename(sys.argv[0]) or 'python'} (pid {os.getpid()}): it {why}; "
              f"it was in {where}", file=sys.stderr, flush=True)
        from .exits import end_process

        end_process(LIMIT_STATUS, "limit")


def watch_from_environment() -> None:
    """At interpreter startup (sitecustomize): watch this process's bounds, if the run set any."""
    text = os.environ.get(ENV_LIMITS)
    if not text:
        return
    try:
        limits = Limits.from_environment(text)
    except (ValueError, TypeError) as e:
        print(f"allocscope: ignoring {ENV_LIMITS}={text!r}: {e}", file=sys.stderr)
        return
    if limits.any():
        threading.Thread(target=_watch, args=(limits, time.monotonic(), threading.main_thread().ident),
                         name="allocscope-limits", daemon=True).start()
