"""Assembling the HTML report: the data it draws (reports/views.py reduces
every per-event array to a few thousand points) and the page around it.

Why plain SVG and no plotting library: the charts are five simple shapes
(stacked areas, floating bars, an icicle, segment bars, tables); a library
would add 100 KB (uPlot) to 3.5 MB (Plotly) to every file and still need
our own code for the icicle and the segments. The page is about 40 KB
plus the data, and opens offline.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

import numpy as np

from ..._version import __version__
from ...allocator.fragmentation import figures
from ...attribution.timeline import relative_time
from ...capture.format import EventKind
from ...capture.reader import Capture
from ...common.progress import Steps
from ..analysis import Analysis, analyse
from ..fit import card_result, searched_memory
from ..report import build_report
from ..sections import REPORT_SECTIONS
from ..views import leaks, marks, module_tree, segments_view, stack_tree, timeline_view

__all__ = ["PAGE_ORDER", "SCHEMA", "html_data", "render", "write_html"]

SCHEMA = "allocscope.html/1"

# The page's data in the order it is written (the sections' parts and the
# page's own views: the timeline, marks, OOMs), then the parts drawn last.
PAGE_ORDER = ("capture", "focus", "focus_label", "peak_reserved", "theory", "gap", "measured", "timeline", "marks",
              "ooms", "groups", "kv_cache", "serving", "sites", "iterations", "warnings", "oom")


def _allocator(report: dict[str, Any], an: Analysis, focus: int) -> dict[str, Any] | None:
    rep = an.replay
    if rep is None or "allocator" not in report:
        return None
    sec = report["allocator"]
    fid = sec.get("replay") or {}
    if fid:
        replay = ("The replay of the allocator reproduced the recording exactly." if fid.get("exact") else
                  f"The replay of the allocator did NOT reproduce the recording exactly "
                  f"({fid['matched']} of {fid['recorded_segment_events']} segment events matched): "
                  "the state below is the model's.")
    else:
        replay = None
    oom = report.get("oom")
    if oom and oom.get("reproduced_by_replay"):
        rec = next(o for o in rep.ooms if o.recorded and o.event == oom["event"])
        state, title = rec.segments, f"The allocator at the out-of-memory error (event {oom['event']})"
    else:
        state = rep.states.get(an.replay_at)
        title = f"The allocator at the peak of reserved memory (event {an.replay_at}), settings: {sec['settings']}"
    if state is None:
        return None
    return {"title": title, "settings": sec["settings"], "figures": figures(state), "replay": replay,
            "view": segments_view(state, an.att)}


def html_data(cap: Capture, *, at: str | None = None, top: int = 200, points: int = 2000,
              steps: Steps | None = None) -> dict[str, Any]:
    """Everything the page draws, JSON-ready (schema SCHEMA)."""
    step = steps.step if steps else (lambda name: None)
    step("attributing")
    an = analyse(cap)
    step("explaining the peak")
    report = build_report(cap, at=at, top=top, analysis=an)
    focus = report.get("at") or report["peak"]
    e = int(focus["event"])
    step("drawing the timeline")
    ev = cap.events
    oom_idx = np.flatnonzero(ev.kind == EventKind.OOM)
    parts: dict[str, Any] = {
        "capture": report["capture"],
        "timeline": timeline_view(an.att, an.tl, points=points),
        "marks": marks(cap, an.att),
        "ooms": [{"event": int(i), "time_ns": relative_time(cap, int(i)), "size": int(ev.size[i] or ev.block[i])}
                 for i in oom_idx.tolist()],
    }
    for section in REPORT_SECTIONS:
        if section.page is not None:
            parts.update(section.page(report))
    data: dict[str, Any] = {"schema": SCHEMA, **{key: parts[key] for key in PAGE_ORDER}}
    fit = cap.metadata.get("fit")
    if isinstance(fit, dict) and fit.get("gpu"):  # a dry run of `allocscope fit`: its verdict first
        data["fit"] = card_result(str(fit["gpu"]), 0, cap, report=report) | {
            "search": fit.get("search"), "value": fit.get("value"), "command": fit.get("command")}
        if fit.get("search"):  # the card's memory against the value, from the search's document beside it
            data["fit"]["memory"] = searched_memory(cap.path, str(fit["gpu"]), str(fit["search"]))
    step("building the trees")
    data["stack_tree"] = stack_tree(an.att, e, fold_library=True)  # what people look at first: their own frames
    data["stack_tree_all"] = stack_tree(an.att, e)
    data["module_tree"] = module_tree(an.att, e)
    data["leaks"] = leaks(an.att, an.tl)
    step("drawing the allocator")
    data["allocator"] = _allocator(report, an, e)
    return data


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render(data: dict[str, Any]) -> str:
    """The page with data inlined. '<' never appears raw in the JSON, so no
    string in a capture can close the script element."""
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    page = _asset("template.html")
    # Substitute the data last: nothing inside it is ever read as a placeholder.
    script = _asset("report.js") + "\n" + _asset("fit.js")  # one script: fit.js's functions are report.js's calls
    for key, value in (("$VERSION", __version__), ("$CSS", _asset("report.css")), ("$JS", script)):
        page = page.replace(key, value)
    return page.replace("$DATA", payload)


def write_html(cap: Capture, path: str | os.PathLike[str], *, at: str | None = None,
               progress: bool | None = None, ranks: dict[str, Any] | None = None) -> int:
    """Writes the report of `cap` to path; returns the file's size. ranks:
    the report across the ranks of cap's run (reports/ranks.py), where cap
    is its worst rank: the page opens with it."""
    steps = Steps("allocscope html", 6, enabled=progress)
    try:
        data = html_data(cap, at=at, steps=steps)
        if ranks is not None:
            data["ranks"] = {k: v for k, v in ranks.items() if k != "worst"}
        steps.step("writing")
        text = render(data)
    finally:
        steps.close()
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return len(text.encode("utf-8"))
