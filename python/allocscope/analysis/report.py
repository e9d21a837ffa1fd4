"""The report: everything `allocscope report` prints, as one JSON-ready dict.
Its schema is versioned (SCHEMA) and written down in docs/report.md."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._format import EventKind
from ..reader import Capture
from .attribution import Attribution, attribute
from .memory import Timeline, category_timeline, iterations, moment, sites, timeline
from .replay import Replay, replay, request_at
from .theory import theory, waterfall
from .whatif import allocator_section, oom_section

__all__ = ["SCHEMA", "Analysis", "MarkNotFound", "analyse", "build_report", "find_mark"]

SCHEMA = "allocscope.report/1"


@dataclasses.dataclass
class Analysis:
    """What every report of one capture starts from (computed once)."""

    cap: Capture
    att: Attribution
    tl: Timeline
    replay: Replay | None = None  # set by build_report on CUDA captures
    replay_at: int | None = None  # the event whose allocator state replay.states holds


def analyse(cap: Capture) -> Analysis:
    att = attribute(cap)
    return Analysis(cap, att, timeline(att))


class MarkNotFound(LookupError):
    """--at names a mark the capture does not have."""


def find_mark(cap: Capture, label: str) -> int:
    """Event index of the first MARK with this label."""
    ev = cap.events
    for i in np.flatnonzero(ev.kind == EventKind.MARK).tolist():
        if cap.label(i) == label:
            return int(i)
    marks = sorted({cap.label(i) for i in np.flatnonzero(ev.kind == EventKind.MARK).tolist()})
    known = ", ".join(repr(m) for m in marks[:10]) or "none"
    raise MarkNotFound(f"no mark labelled {label!r} in {cap.path} (marks: {known})")


def _section(att: Attribution, tl: Timeline, e: int, top: int) -> dict[str, Any]:
    m = moment(att, e, tl, top)
    th = theory(att, e)
    gap, measured = waterfall(att, m, th, tl)
    return {"moment": m.to_json(), "theory": th, "gap": gap, "measured": measured}


REPLAY_BUDGET = 2_000_000


def build_report(cap: Capture, *, at: str | None = None, top: int = 20,
                 replay_budget: int = REPLAY_BUDGET, analysis: Analysis | None = None) -> dict[str, Any]:
    """The report of a capture: the peak (or the first mark `at`) explained.
    On CUDA captures of more than `replay_budget` events, the allocator is
    replayed only as far as the report needs."""
    an = analysis or analyse(cap)
    att, tl = an.att, an.tl
    peak = tl.peak("allocated")
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "capture": {
            "path": cap.path, "complete": cap.complete, "events": len(cap.events),
            "device_type": att.device_type, "torch": cap.metadata.get("torch"),
            "duration_ns": cap.duration_ns, "watched": [w.get("name") for w in att.watches],
        },
        "units": "bytes",
    }
    focus = peak if at is None else find_mark(cap, at)
    main = _section(att, tl, focus, top)
    out["peak"] = moment(att, peak, tl, top).to_json() if at is not None else main["moment"]
    if at is not None:
        out["at"] = main["moment"] | {"label": at}
    if tl.reserved is not None:
        out["peak_reserved"] = moment(att, tl.peak("reserved"), tl, top).to_json()
    out["theory"] = main["theory"]
    out["gap"] = main["gap"]
    out["measured"] = main["measured"]
    out["iterations"] = iterations(att, tl)
    out["sites"] = sites(att, focus, top)
    out["timeline"] = category_timeline(att, tl)
    out["warnings"] = list(cap.warnings) + att.warnings
    if att.device_type == "cuda":
        # The allocator's side: its state replayed at the peak of reserved
        # memory, and the post-mortem of an OOM (docs/allocator.md).
        at = request_at(cap, tl.peak("reserved"))
        stop = None
        if len(cap.events) > replay_budget:
            # Long captures: replay only as far as the report looks (the
            # peak, the OOMs); `allocscope simulate` replays everything.
            ooms = np.flatnonzero(cap.events.kind == EventKind.OOM)
            stop = max([at] + ooms.tolist())
            if stop < len(cap.events) - 1:
                out["warnings"].append(
                    f"the allocator was replayed up to event {stop} of {len(cap.events)} (the capture is longer "
                    f"than {replay_budget} events); `allocscope simulate` replays all of it")
            else:
                stop = None
        try:
            rep = replay(cap, states_at=[at], stop_after=stop)
        except (KeyError, TypeError, ValueError) as e:  # a baseline this replay cannot read
            out["warnings"].append(f"the allocator could not be replayed: {type(e).__name__}: {e}")
            return out
        an.replay, an.replay_at = rep, at
        out["allocator"] = allocator_section(cap, att, rep, at=at, top=top)
        oom = oom_section(cap, att, rep, top=top)
        if oom is not None:
            out["oom"] = oom
    return out
