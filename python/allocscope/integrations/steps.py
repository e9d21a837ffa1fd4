"""What the framework callbacks share: recording optimizer steps first..last
of a training run (the framework's own step numbers) into one capture per
rank, the framework's model and optimizer watched, a mark at each step."""

from __future__ import annotations

import os
from typing import Any

from ..common.errors import InputError
from ..recording.session import Recording, mark

__all__ = ["StepRecorder", "step_range"]


def step_range(steps: Any) -> tuple[int, int]:
    """(first, last), inclusive, from an int (one step), a (first, last)
    pair or a range (range(10, 13) is steps 10, 11 and 12)."""
    if isinstance(steps, range):
        if steps.step != 1 or len(steps) == 0:
            raise InputError(f"steps: a range of consecutive steps, not {steps!r}")
        first, last = steps.start, steps.stop - 1
    elif isinstance(steps, int) and not isinstance(steps, bool):
        first = last = steps
    elif isinstance(steps, (tuple, list)) and len(steps) == 2 and all(
            isinstance(s, int) and not isinstance(s, bool) for s in steps):
        first, last = steps
    else:
        raise InputError(f"steps: a step, (first, last) or a range, not {steps!r}")
    if not 0 <= first <= last:
        raise InputError(f"steps: 0 <= first <= last, not {first}..{last}")
    return first, last


def _innermost_optimizer(optimizer: Any) -> Any:
    """The torch optimizer under a framework's wrapper (accelerate's
    AcceleratedOptimizer, Lightning's LightningOptimizer hold it as
    .optimizer): the one whose step() runs, and whose state is the state."""
    while optimizer is not None and getattr(optimizer, "optimizer", None) is not None:
        optimizer = optimizer.optimizer
    return optimizer


class StepRecorder:
    """Records steps first..last: starts at the beginning of the first of
    them that runs (step_begins), stops once the last has ended (step_ended)
    or the run ends (stop). path: the capture; with several ranks, rank r
    writes FILE.rank{r}.alsc beside it (allocscope's name for a run's ranks)."""

    def __init__(self, path: str | os.PathLike[str], steps: Any, *, device: Any = None, stacks: str = "python",
                 ops: bool | None = None):
        self.first, self.last = step_range(steps)
        self.path = os.path.abspath(os.fspath(path))
        self.options = {"device": device, "stacks": stacks, "ops": ops}
        Recording(self.path, **self.options)  # bad options fail here, before training starts
        self.recording: Recording | None = None
        self.written: list[str] = []  # the captures written

    def capture_path(self, rank: int, world: int) -> str:
        if world <= 1:
            return self.path
        stem, ext = os.path.splitext(self.path)
        return f"{stem}.rank{rank}{ext or '.alsc'}"

    def step_begins(self, step: int, model: Any, optimizer: Any, rank: int = 0, world: int = 1) -> None:
        if self.recording is None and not self.written and self.first <= step <= self.last:
            self.recording = Recording(self.capture_path(rank, world), **self.options).start()
            self.recording.watch(model, _innermost_optimizer(optimizer))
        if self.recording is not None:
            mark(f"step {step}")

    def step_ended(self, steps_done: int) -> None:
        """steps_done: the optimizer steps the run has made (step k has ended when it is k + 1)."""
        if self.recording is not None and steps_done > self.last:
            self.stop()

    def stop(self, reason: str = "stopped") -> None:
        if self.recording is not None:
            rec, self.recording = self.recording, None
            rec.stop(reason)
            self.written.append(rec.path)
