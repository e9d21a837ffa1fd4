"""What every report of a capture starts from (analyse: the attribution, the
timelines and, on CUDA, the replay of the allocator, computed once and
shared by report, html, diff and fit), and the moments a report can be
asked about: a mark (find_mark) or some optimizer steps (step_window)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..allocator import native
from ..allocator.recorded import recorded_reserved, request_at
from ..allocator.replay import Replay, replay
from ..attribution.categories import Attribution, attribute
from ..attribution.timeline import Timeline, iteration_bounds, timeline
from ..capture.checkpoints import first_mark
from ..capture.format import EventKind
from ..capture.reader import Capture
from ..common.errors import InputError

__all__ = ["REPLAY_BUDGET", "Analysis", "MarkNotFound", "StepsNotFound", "analyse", "find_mark", "step_window"]

# Captures longer than this replay in Python only as far as the reports look
# (the native replay, allocator/native.py, replays any length: millions of
# events per second).
REPLAY_BUDGET = 2_000_000


@dataclasses.dataclass
class Analysis:
    """What every report of one capture starts from (computed once)."""

    cap: Capture
    att: Attribution
    tl: Timeline
    replay: Replay | None = None  # CUDA captures: the replay with the recorded settings
    replay_at: int | None = None  # the event whose allocator state replay.states holds
    warnings: list[str] = dataclasses.field(default_factory=list)


def analyse(cap: Capture, *, replay_budget: int = REPLAY_BUDGET, window: tuple[int, int] | None = None) -> Analysis:
    """Attribution and timelines; on CUDA first the allocator's replay (its
    state at the peak of reserved memory, and each block's real size when
    the replay is exact). Captures of more than `replay_budget` events that
    only the Python replay can take (expandable segments, private pools) are
    replayed only as far as the reports look (the peak, the OOMs). window:
    events (first, last) the report looks at (report --steps): the allocator
    is replayed up to its end, its state kept at its peak of reserved memory."""
    if "cuda" not in (cap.metadata.get("devices_recorded") or ()):
        att = attribute(cap)
        return Analysis(cap, att, timeline(att))
    warnings: list[str] = []
    reserved = recorded_reserved(cap)
    if window is None:
        at = request_at(cap, int(np.argmax(reserved)) - 1)
    else:
        at = request_at(cap, window[0] + int(np.argmax(reserved[window[0] + 1:window[1] + 2])))
    stop = None if window is None else window[1]
    if window is None and len(cap.events) > replay_budget and not native.can_replay(cap):
        ooms = np.flatnonzero(cap.events.kind == EventKind.OOM)
        stop = max([at] + ooms.tolist())
        if stop < len(cap.events) - 1:
            warnings.append(
                f"the allocator was replayed up to event {stop} of {len(cap.events)} (the capture is longer "
                f"than {replay_budget} events); `allocscope simulate` replays all of it")
        else:
            stop = None
    rep: Replay | None
    try:
        rep = replay(cap, states_at=[at], stop_after=stop)
    except (KeyError, TypeError, ValueError) as e:  # a baseline this replay cannot read
        warnings.append(f"the allocator could not be replayed: {type(e).__name__}: {e}")
        rep = None
    exact = rep is not None and rep.fidelity is not None and rep.fidelity.exact
    att = attribute(cap, rep.block_sizes if exact else None)
    if rep is not None and not exact:
        warnings.append("the replay did not follow the recording exactly: block sizes are the rounded "
                        "requests (unsplit remainders count as cached free memory)")
    return Analysis(cap, att, timeline(att, reserved), rep, at if rep is not None else None, warnings)


class MarkNotFound(InputError, LookupError):
    """--at names a mark the capture does not have."""


class StepsNotFound(InputError, LookupError):
    """--steps names iterations the capture does not have."""


def step_window(cap: Capture, first: int, last: int) -> tuple[int, int]:
    """The events (first, last) of iterations first..last (optimizer steps,
    as the watched phases number them; timeline.iteration_bounds)."""
    ev = cap.events
    p_idx = np.flatnonzero(ev.kind == EventKind.PHASE)
    if not len(p_idx):
        raise StepsNotFound(f"{cap.path} has no iterations (they come from a watched model: rec.watch)")
    keys, starts, ends = iteration_bounds(p_idx, ev.addr[p_idx].astype(np.int64), len(ev))
    sel = (keys >= first) & (keys <= last)
    if not sel.any():
        raise StepsNotFound(f"no iterations {first}-{last} in {cap.path} (it has {int(keys.min())}-{int(keys.max())})")
    return int(starts[sel].min()), int(ends[sel].max()) - 1


def find_mark(cap: Capture, label: str) -> int:
    """Event index of the first MARK with this label."""
    first = first_mark(cap, label)
    if first is not None:
        return first
    ev = cap.events
    marks = sorted({cap.label(i) for i in np.flatnonzero(ev.kind == EventKind.MARK).tolist()})
    known = ", ".join(repr(m) for m in marks[:10]) or "none"
    raise MarkNotFound(f"no mark labelled {label!r} in {cap.path} (marks: {known})")
