"""Finishing a capture however its process ends.

A normal exit runs atexit handlers; a process that leaves by os._exit runs
none: multiprocessing's forked children always leave that way (DataLoader
workers, vLLM's engine core, a Pool's workers), and so do programs that end
with os._exit(0), or a SIGTERM handler that calls it. What is registered
here runs on either way out, once, in the process that registered it, last
registered first (as atexit does). SIGTERM with its default action, or
with a handler that is not Python's (faulthandler's, chained), is the
recorder's own (csrc/recorder/recorder.cpp: it finishes the file, then
raises SIGTERM again with what was there); a Python handler for it raises
SystemExit or calls os._exit, which both come here.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
from typing import Any, Callable

__all__ = ["EXIT", "OS_EXIT", "at_process_exit", "end_process"]

# The reasons handlers are called with (a capture's footer says which)
EXIT = "exit"
OS_EXIT = "os._exit"

_handlers: list[Callable[[str], None]] = []
_owner_pid = 0  # the process the handlers are for: a forked child has a copy of its parent's
_os_exit: Any = None  # the real os._exit, once it is wrapped


def at_process_exit(handler: Callable[[str], None]) -> None:
    """Calls handler(EXIT or OS_EXIT) when this process ends by a normal
    exit or by os._exit, whichever comes first; not in a forked child.
    A handler already waiting is not added twice."""
    global _owner_pid
    if _owner_pid != os.getpid():
        _handlers.clear()
        _owner_pid = os.getpid()
    if handler not in _handlers:
        _handlers.append(handler)
    _install()


def end_process(status: int, reason: str) -> None:
    """Ends this process now, from any thread: the handlers run with `reason` (a capture's footer says it),
    then os._exit(status)."""
    _run(reason)
    (_os_exit or os._exit)(status)


def _install() -> None:
    global _os_exit
    if _os_exit is not None:
        return
    _os_exit = os._exit
    atexit.register(_run, EXIT)

    @functools.wraps(_os_exit)
    def _exit(status: int, /) -> None:
        # (os._exit also leaves forked children of the process that wrapped
        # it: there the handlers are cleared, and the exit is the real one.)
        _run(OS_EXIT)
        _os_exit(status)

    os._exit = _exit


def _run(reason: str) -> None:
    if _owner_pid != os.getpid():
        return
    while _handlers:
        handler = _handlers.pop()
        try:
            handler(reason)
        except BaseException as e:  # the process is leaving: say why a capture may be unfinished, and go on
            print(f"allocscope: at {reason}: {type(e).__name__}: {e}", file=sys.stderr)
