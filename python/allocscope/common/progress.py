"""A dependency-free progress bar on stderr, for long reads and analyses."""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "Steps"]

_MIN_BYTES_FOR_AUTO = 32 << 20


class Progress:
    """Draws `label [#####     ] 52%` on stderr, at most 10 times a second.

    enabled=None shows it only on a terminal and only for work of at least
    32 MiB (so small files and pipes stay quiet).
    """

    def __init__(self, label: str, total: int, *, enabled: bool | None = None):
        if enabled is None:
            enabled = total >= _MIN_BYTES_FOR_AUTO and sys.stderr.isatty()
        self.enabled = enabled and total > 0
        self.label = label
        self.total = total
        self._last = 0.0
        self._drawn = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(1.0, done / self.total)
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:4.0%}")
        sys.stderr.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            sys.stderr.write("\r" + " " * (len(self.label) + 40) + "\r")
            sys.stderr.flush()


class Steps:
    """Progress through the named stages of a long analysis, drawn as
    `label [#####     ] 2/5 attributing` on stderr (only on a terminal,
    unless enabled says otherwise)."""

    def __init__(self, label: str, stages: int, *, enabled: bool | None = None):
        self._bar = Progress(label, stages, enabled=sys.stderr.isatty() if enabled is None else enabled)
        self.done = 0

    def step(self, name: str) -> None:
        bar = self._bar
        if bar.enabled:
            frac = min(1.0, self.done / bar.total)
            sys.stderr.write(f"\r{bar.label} [{'#' * int(frac * 30):<30}] {self.done}/{bar.total} {name:<24}")
            sys.stderr.flush()
            bar._drawn = True
        self.done += 1

    def close(self) -> None:
        self._bar.close()
