"""Running the user's command as a child process (run, fit): the command
line as given (python implied for a script), and waiting for it while the
terminal's Ctrl-C reaches the child alone and SIGTERM is passed on, so that
its capture is finished."""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import signal
import subprocess
import sys
import time
from typing import Sequence

from ..common.errors import InputError

__all__ = ["command_line", "finished_outputs", "outputs", "wait_for", "wait_for_all"]


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


# How long a run waits for processes that outlive its command's first one to
# finish their captures, and after how long it says that it waits.
STRAGGLERS_WAIT_S = 120.0
STRAGGLERS_NOTE_S = 2.0


def finished_outputs(path: str, *, wait_s: float = STRAGGLERS_WAIT_S) -> list[str]:
    """outputs(path), once no process is still writing any of them: a
    process that outlived the command's first one (an engine whose parent
    died, a daemon being shut down) holds its capture's write lock until
    the file is finished (docs/format.md, "While it is written"). After
    wait_s, or at Ctrl-C, the captures as they are, with a line saying
    which are still written."""
    start = time.monotonic()
    noted = False
    try:
        while True:
            busy = [p for p in outputs(path) if _being_written(p)]
            waited = time.monotonic() - start
            if not busy or waited >= wait_s:
                break
            if not noted and waited >= STRAGGLERS_NOTE_S:
                print(f"allocscope: waiting for {len(busy)} process(es) of the command still writing "
                      f"{', '.join(os.path.basename(p) for p in busy)}", file=sys.stderr)
                noted = True
            time.sleep(0.02)
    except KeyboardInterrupt:
        busy = [p for p in outputs(path) if _being_written(p)]
    if busy:
        print(f"allocscope: still being written by a process of the command (complete when it ends): "
              f"{', '.join(os.path.relpath(p) for p in busy)}", file=sys.stderr)
    return outputs(path)


def _being_written(path: str) -> bool:
    """Whether another process holds the capture's write lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        # (taken by this process: released by the close below)
        return False
    except OSError as e:  # held: EAGAIN or EACCES; a file system without locks says ENOLCK (nothing to wait for)
        return e.errno in (errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)


def wait_for(cmd: list[str], env: dict[str, str], *, output_to_stderr: bool = False, log: str | None = None) -> int:
    """Runs cmd to its end; its exit status (128 + N for a signal N).
    output_to_stderr: the child's standard output goes to our standard error
    (so that ours holds only what we print, e.g. JSON). log: both its
    outputs go to this file instead (overwritten)."""
    return wait_for_all([(cmd, env, log)], output_to_stderr=output_to_stderr)[0]


def wait_for_all(children: Sequence[tuple[list[str], dict[str, str], str | None]], *,
                 output_to_stderr: bool = False) -> list[int]:
    """wait_for for several commands at once, each (cmd, env, log): started
    together, each run to its end; their exit statuses, in order."""
    started: list[subprocess.Popen] = []
    try:
        for cmd, env, log in children:
            started.append(_start(cmd, env, output_to_stderr, log))
    except BaseException:
        for child in started:
            child.kill()
            child.wait()
        raise
    # The terminal sends Ctrl-C to the children too; let them finish their captures.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def forward(signum: int, frame: object) -> None:
        for child in started:
            if child.poll() is None:
                child.send_signal(signum)

    previous_term = signal.signal(signal.SIGTERM, forward)
    try:
        statuses = _wait_all(started) if len(started) > 1 else [started[0].wait()]
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
    return [status if status >= 0 else 128 - status for status in statuses]


# Processes that wait for each other (ranks together): once one has failed,
# how long the others may go on before they are stopped (SIGTERM: their
# captures are finished), and how long after that before SIGKILL.
PEER_FAILED_GRACE_S = 20.0
STOP_GRACE_S = 30.0


def _wait_all(started: list[subprocess.Popen]) -> list[int]:
    """Waits for every child; once one has exited with a non-zero status,
    stops those still running after PEER_FAILED_GRACE_S: a rank that waits
    for a peer that died would wait for it to the end of its timeout."""
    failed_at = stopped_at = None
    while any(child.poll() is None for child in started):
        now = time.monotonic()
        if failed_at is None and any(child.returncode not in (None, 0) for child in started):
            failed_at = now
        if failed_at is not None and stopped_at is None and now - failed_at > PEER_FAILED_GRACE_S:
            stopped_at = now
            print("allocscope: a rank failed; stopping the ranks still waiting for it", file=sys.stderr)
            for child in started:
                if child.poll() is None:
                    child.terminate()
        if stopped_at is not None and now - stopped_at > STOP_GRACE_S:
            for child in started:
                if child.poll() is None:
                    child.kill()
        time.sleep(0.05)
    return [child.wait() for child in started]


def _start(cmd: list[str], env: dict[str, str], output_to_stderr: bool, log: str | None) -> subprocess.Popen:
    out = open(log, "wb") if log is not None else None  # (an error here names the log, not the command)
    try:
        if out is not None:
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return subprocess.Popen(cmd, env=env, stdout=sys.stderr if output_to_stderr else None)
    except OSError as e:
        raise InputError(f"cannot run {cmd[0]}: {e.strerror}") from None
    finally:
        if out is not None:
            out.close()  # the child has its own copy
