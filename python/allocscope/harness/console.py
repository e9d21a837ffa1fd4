"""What `fit` shows on standard error while it runs: one line per run (the
card, the value searched, the verdict, the peak or the shortfall, the time),
a bar over the runs on a terminal, and, where a run failed for a reason other
than memory, the last lines of its output and the log they are in.

The runs' own output (the command's prints, torch's warnings, the traceback
of an out-of-memory error) goes to a log beside each capture; `--verbose`
passes it through instead, as `allocscope run` does."""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import Any, TextIO

from ..common.units import format_bytes

__all__ = ["FAILED_TAIL_LINES", "RunConsole", "first_error", "log_path", "tail"]

FAILED_TAIL_LINES = 15


def log_path(capture_path: str) -> str:
    """The log of the run that writes capture_path: beside it, `.log` for `.alsc`."""
    stem, ext = os.path.splitext(capture_path)
    return (stem if ext == ".alsc" else capture_path) + ".log"


def tail(path: str, lines: int = FAILED_TAIL_LINES) -> list[str]:
    """The last lines of a log (none where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.rstrip("\n").splitlines()[-lines:] if text.strip() else []


# An exception's line in a log: "ValueError: ...", after any prefix a
# process puts before its lines ("(EngineCore pid=314) ERROR ... [core.py:1584] ").
_EXCEPTION = re.compile(r"(?:^|\s)((?:[A-Za-z_][\w.]*)?(?:Error|Exception): .*)$")


def first_error(path: str) -> str | None:
    """The first exception a log names: where several processes fail in
    turn (a serving engine's core, then its client), the cause."""
    try:
        with open(path, "rb") as f:
            text = f.read(4 << 20).decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        m = _EXCEPTION.search(line)
        if m:
            return m.group(1).strip()
    return None


class RunConsole:
    """Lines on `stream` (stderr) for the runs of one fit: `begin` before a
    run, `end` after it with its card result. verbose: say where each run
    starts (its output then shows on its own) and nothing after it."""

    def __init__(self, expected_runs: int, *, verbose: bool = False, stream: TextIO | None = None,
                 logs: str | None = None):
        """logs: the folder the runs' logs go to, named once before the first run."""
        self.expected = max(1, expected_runs)
        self.logs = logs
        self.verbose = verbose
        self.stream = stream or sys.stderr
        self.done = 0
        self._bar = not verbose and self.stream.isatty()
        self._bar_drawn = False

    def note(self, text: str) -> None:
        """A line of fit's own (a replay foreseen, a wait), kept above the bar."""
        self._clear()
        print(f"allocscope fit: {text}", file=self.stream)
        self._draw()

    def begin(self, where: str) -> None:
        if self.verbose:
            print(f"allocscope fit: running {where}", file=self.stream)
            return
        if self.logs is not None:
            print(f"allocscope fit: each run's output goes to a log beside its capture in "
                  f"{os.path.relpath(self.logs)}/ (--verbose shows it as it runs)", file=self.stream)
            self.logs = None
        self._draw(where)

    def end(self, label: str, card: dict[str, Any], seconds: float, log: str | None) -> None:
        """A run ended: its line, and the end of its log where it failed
        without running out of memory."""
        self.done += 1
        if self.verbose:
            return
        self._clear()
        print(f"  {label:<28} {_verdict(card):<40} {seconds:6.1f} s", file=self.stream)
        if card.get("verdict") in ("failed", "no capture") and log is not None:
            lines = tail(log)
            if lines:
                print(f"    the run's last {len(lines)} lines of output:", file=self.stream)
                for line in lines:
                    print(f"    | {line}", file=self.stream)
            cause = first_error(log)
            if cause is not None and not any(cause in line for line in lines):
                print(f"    the first error in it: {cause}", file=self.stream)
            print(f"    all of it: {os.path.relpath(log)}", file=self.stream)
        self._draw()

    def close(self) -> None:
        self._clear()

    def _draw(self, where: str = "") -> None:
        if not self._bar:
            return
        frac = min(1.0, self.done / self.expected)
        text = f"allocscope fit [{'#' * int(frac * 24):<24}] {self.done} of {self.expected} runs at most"
        if where:
            text += f": running {where}"
        # one line, short of the terminal's width: \r cannot go back over a wrapped one
        self.stream.write("\r" + text[:shutil.get_terminal_size().columns - 1])
        self.stream.flush()
        self._bar_drawn = True

    def _clear(self) -> None:
        if self._bar_drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._bar_drawn = False


def _verdict(card: dict[str, Any]) -> str:
    verdict = card.get("verdict", "?")
    if verdict == "fits" and card.get("peak_reserved_bytes") is not None:
        return f"fits, peak reserved {format_bytes(card['peak_reserved_bytes'])}"
    if verdict == "out of memory" and card.get("shortfall_bytes") is not None:
        return f"out of memory, short by {format_bytes(card['shortfall_bytes'])}"
    if verdict == "failed":
        return f"failed (exit status {card.get('exit_status')})"
    if verdict == "no capture":
        status = card.get("exit_status")
        return f"failed (exit status {status}), no capture" if status else "no capture (it never used CUDA)"
    return verdict
