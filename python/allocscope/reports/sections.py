"""The report's sections, each in one form (Section): how it builds its part
of the document (`allocscope report --json`; docs/report.md), how it reads
as text (`allocscope report`), what it gives the HTML page and which of
html/report.js's functions draw it. REPORT_SECTIONS lists them once, in the
document's order; report.py walks them to build and to render, and
html/page.py to fill the page.

Adding a section: its Section here (build, text, page, html); its name in
report.py's TEXT_ORDER where it has text and its page keys in html/page.py's
PAGE_ORDER (tests/unit/test_report_sections.py fails until they are there);
its rows in docs/report.md; for the page, its drawing in html/report.js."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import numpy as np

from ..attribution.categories import CATEGORIES, module_label
from ..attribution.estimate import theory, waterfall
from ..attribution.ops import NO_OP
from ..attribution.timeline import Moment, category_timeline, iterations, moment, ops, sites
from ..capture.reader import Capture
from ..common.units import format_bytes
from .allocator import allocator_lines, allocator_section, oom_lines, oom_section
from .analysis import Analysis
from .serving import serving_lines, serving_measured, serving_side_by_side
from .text import shorten, table

__all__ = ["MAX_PAGE_ITERATIONS", "REPORT_SECTIONS", "Scope", "Section", "kv_cache_lines", "peak_of",
           "waterfall_lines"]

MAX_PAGE_ITERATIONS = 2000


def peak_of(series: np.ndarray, window: tuple[int, int] | None) -> int:
    """The first event where a timeline's series is highest (-1: the start), in the window if any."""
    if window is None:
        return int(np.argmax(series)) - 1
    lo, hi = window
    return lo + int(np.argmax(series[lo + 1:hi + 2]))


@dataclasses.dataclass
class Scope:
    """What the sections of one report look at: the capture and its analysis,
    the moment explained (`focus`: the peak, or the mark `at`), the peak of
    allocated memory, and the events of --steps (`window`)."""

    cap: Capture
    an: Analysis
    at: str | None
    steps: tuple[int, int] | None
    window: tuple[int, int] | None
    top: int
    peak: int
    focus: int

    @functools.cached_property
    def focus_moment(self) -> Moment:
        return moment(self.an.att, self.focus, self.an.tl, self.top)


Document = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Section:
    """build(scope, document so far): its keys of the document (none where it
    does not apply); text(document, top): its lines of the text; page(document):
    its keys of the HTML page's data; html: the functions of html/report.js
    that draw them."""

    name: str
    build: Callable[[Scope, Document], Document]
    text: Callable[[Document, int], list[str]] | None = None
    page: Callable[[Document], Document] | None = None
    html: tuple[str, ...] = ()


# ---- the moments explained: the peak (or the mark), and the peak of reserved memory


def _build_moments(s: Scope, doc: Document) -> Document:
    att, tl = s.an.att, s.an.tl
    out = {"peak": moment(att, s.peak, tl, s.top).to_json() if s.at is not None else s.focus_moment.to_json()}
    if s.at is not None:
        out["at"] = s.focus_moment.to_json() | {"label": s.at}
    if tl.reserved is not None:
        out["peak_reserved"] = moment(att, peak_of(tl.reserved, s.window), tl, s.top).to_json()
    return out


def _text_moments(r: Document, top: int) -> list[str]:
    focus = r.get("at") or r["peak"]
    lines = ["", "By category (requested bytes):"]
    cats = [(c, format_bytes(b)) for c, b in sorted(focus["by_category"].items(), key=lambda kv: -kv[1]) if b]
    lines += table(cats, {1}) if cats else ["  (nothing live)"]
    lines += ["", "By module:"]
    classes = r.get("module_classes", {})
    mods = [(module_label(mname, classes), format_bytes(b)) for mname, b in list(focus["by_module"].items())[:top]]
    lines += table(mods, {1}) if mods else ["  (nothing live)"]
    lines += ["", "Largest groups (category, module, source line):"]
    groups = [(format_bytes(g["bytes"]), str(g["count"]), g["category"], module_label(g["module"], classes) or "-",
               shorten(g["site"]))
              for g in focus["top"][:top]]
    lines += table([("bytes", "n", "category", "module", "site")] + groups, {0, 1}) if groups else ["  (none)"]
    return lines


def _page_moments(r: Document) -> Document:
    focus = r.get("at") or r["peak"]
    return {"focus": focus, "focus_label": f"mark {r['at']['label']!r}" if "at" in r else "peak",
            "peak_reserved": r.get("peak_reserved"),
            "groups": [g | {"module": module_label(g["module"], r["module_classes"])} for g in focus["top"]]}


# ---- the waterfall: the textbook estimate, item by item, to the measured bytes


def _build_waterfall(s: Scope, doc: Document) -> Document:
    th = theory(s.an.att, s.focus)
    gap, measured = waterfall(s.an.att, s.focus_moment, th, s.an.tl)
    return {"theory": th, "gap": gap, "measured": measured}


def waterfall_lines(th: Document, gap: list[Document], measured: Document) -> list[str]:
    """The waterfall as text: the textbook estimate (build_report's "theory"),
    each item of the difference ("gap"), the measured total ("measured")."""
    asked = f" + KV cache for {th['kv_cache_tokens']:,} tokens asked" if th.get("kv_cache_tokens") else ""
    rows = [("estimate", format_bytes(th["total"]), "parameters + gradients + optimizer state + "
             "activations x2 + inputs" if th["training"] else "parameters + activations of one forward + inputs" +
             asked)]
    for item in gap:
        if item["bytes"] == 0:
            continue
        sign = "+" if item["bytes"] >= 0 else "-"
        rows.append((f"{sign} {item['item']}", format_bytes(abs(item["bytes"])), item["detail"]))
    rows.append(("= measured", format_bytes(measured["total_bytes"]), measured["basis"].replace("_", " ")))
    return table(rows, {1}) + [f"  note: {note}" for note in th["notes"]]


def _text_waterfall(r: Document, top: int) -> list[str]:
    return ["", "Theory vs practice (textbook estimate -> measured):"] + waterfall_lines(r["theory"], r["gap"],
                                                                                        r["measured"])


# ---- the iterations (optimizer steps)


def _build_iterations(s: Scope, doc: Document) -> Document:
    its = iterations(s.an.att, s.an.tl)
    return {"iterations": its if s.steps is None else [i for i in its if s.steps[0] <= i["iteration"] <= s.steps[1]]}


def _text_iterations(r: Document, top: int) -> list[str]:
    its = r["iterations"]
    if not its:
        return []
    lines = ["", "Iterations (optimizer steps):"]
    lines += table([("iter", "peak", "growth", "leaked")] + [
        (str(i["iteration"]), format_bytes(i["peak_allocated_bytes"]), format_bytes(i["growth_bytes"]),
         format_bytes(i["leaked_bytes"])) for i in its[:top]], {0, 1, 2, 3})
    if len(its) > top:
        lines.append(f"  ... {len(its) - top} more (--json for all)")
    return lines


def _page_iterations(r: Document) -> Document:
    keep = ("iteration", "peak_allocated_bytes", "growth_bytes", "leaked_bytes")
    its = r["iterations"]
    if len(its) > MAX_PAGE_ITERATIONS:  # evenly chosen, always with the first and the last
        its = [its[int(i)] for i in np.linspace(0, len(its) - 1, MAX_PAGE_ITERATIONS).astype(np.int64)]
    return {"iterations": [{k: it[k] for k in keep} for it in its]}


# ---- the allocation sites and the ops


def _text_sites(r: Document, top: int) -> list[str]:
    if not r["sites"]:
        return []
    rows = [(format_bytes(s["live_bytes"]), format_bytes(s["allocated_bytes"]), str(s["allocations"]),
             shorten(s["site"])) for s in r["sites"][:top]]
    return ["", "Top allocation sites (live here, allocated in all):"] + table(
        [("live", "allocated", "count", "site")] + rows, {0, 1, 2})


def _text_ops(r: Document, top: int) -> list[str]:
    if any(o["op"] != NO_OP for o in r.get("ops", ())):
        return ["", "Top ops (live here, allocated in all):"] + table([("live", "allocated", "count", "op")] + [
            (format_bytes(o["live_bytes"]), format_bytes(o["allocated_bytes"]), str(o["allocations"]), o["op"])
            for o in r["ops"][:top]], {0, 1, 2})
    if r["capture"].get("ops") in ("watch", False):
        return ["", "Top ops: none recorded (by default ops are recorded from the first watch() on; "
                "`allocscope run --ops` or record(ops=True) records them from the start)"]
    return []


# ---- the KV cache of generation and serving: its bytes, in tokens


def _build_kv_cache(s: Scope, doc: Document) -> Document:
    att = s.an.att
    rows = np.flatnonzero(att.category == CATEGORIES.index("kv_cache"))
    shapes = [w["kv_cache"] for w in att.watches if isinstance(w.get("kv_cache"), dict)]
    if not len(rows):
        return {}
    here = int(s.focus_moment.by_category.get("kv_cache", 0))
    # the most live at once: +size at each allocation, -size at each free
    at = np.concatenate((np.maximum(att.start[rows], -1), att.end[rows]))
    change = np.concatenate((att.size[rows], -att.size[rows])).astype(np.int64)
    order = np.lexsort((change, at))  # (a free before an allocation of the same moment)
    most = int(max(0, np.cumsum(change[order]).max()))
    out: Document = {"bytes": here, "most_bytes": most, "allocations": int(len(rows)), "shape": None}
    if shapes:
        shape, per_token = shapes[0], int(shapes[0]["bytes_per_token"])
        out.update(shape=shape, tokens=here // per_token, most_tokens=most // per_token,
                   tokens_per_gib=(1 << 30) // per_token)
    return {"kv_cache": out}


def kv_cache_lines(kv: Document | None) -> list[str]:
    """The report's "kv_cache" (also a fit card's) as text: its bytes, in tokens."""
    if not kv:
        return []
    line = f"KV cache: {format_bytes(kv['bytes'])} here, at most {format_bytes(kv['most_bytes'])}"
    shape = kv.get("shape")
    if shape is None:
        return [line + " (no watched model's config gives the bytes a token takes)"]
    return [line, f"  {kv['tokens']:,} tokens here, at most {kv['most_tokens']:,}, of "
            f"{format_bytes(shape['bytes_per_token'])} each: 2 x {shape['layers']} layers x {shape['kv_heads']} "
            f"key/value heads x {shape['head_dim']} x {shape['bytes_per_element']} B; "
            f"{kv['tokens_per_gib']:,} tokens a GiB"]


def _text_kv_cache(r: Document, top: int) -> list[str]:
    lines = kv_cache_lines(r.get("kv_cache"))
    return ["", *lines] if lines else []


# ---- what the report could not do, and the classes of the modules it names


def _build_warnings(s: Scope, doc: Document) -> Document:
    return {"warnings": list(s.cap.warnings) + s.an.att.warnings + s.an.warnings}


def _build_module_classes(s: Scope, doc: Document) -> Document:
    """The class of each module the report names (where the watch said it)."""
    classes = s.an.att.module_classes
    moments = [doc.get(key) or {} for key in ("peak", "at", "peak_reserved")]
    names = {g.get("module") for m in moments for g in m.get("top", ())} | {n for m in moments
                                                                            for n in m.get("by_module", {})}
    return {"module_classes": {n: classes[n] for n in sorted(n for n in names if n in classes)}}


# ---- the allocator's side (CUDA): its state at the peak of reserved memory, an OOM's post-mortem


def _build_allocator(s: Scope, doc: Document) -> Document:
    if s.an.replay is None or s.an.replay_at is None:
        return {}
    return {"allocator": allocator_section(s.cap, s.an.att, s.an.replay, at=s.an.replay_at, top=s.top)}


def _build_oom(s: Scope, doc: Document) -> Document:
    if s.an.replay is None or s.an.replay_at is None:
        return {}
    oom = oom_section(s.cap, s.an.att, s.an.replay, top=s.top)
    return {} if oom is None else {"oom": oom}


def _build_serving(s: Scope, doc: Document) -> Document:
    measured = serving_measured(s.cap, s.an.tl, doc)
    return {} if measured is None else {"serving": measured}


def _text_serving(r: Document, top: int) -> list[str]:
    lines = serving_lines(serving_side_by_side(r.get("serving"), None, r.get("kv_cache")))
    return ["", *lines] if lines else []


REPORT_SECTIONS: tuple[Section, ...] = (
    Section("moments", _build_moments, _text_moments, _page_moments, ("header", "drawTimeline", "tables")),
    Section("waterfall", _build_waterfall, _text_waterfall, lambda r: {k: r[k] for k in ("theory", "gap", "measured")},
            ("drawWaterfall",)),
    Section("kv_cache", _build_kv_cache, _text_kv_cache, lambda r: {"kv_cache": r.get("kv_cache")}, ("tables",)),
    Section("iterations", _build_iterations, _text_iterations, _page_iterations, ("tables",)),
    Section("sites", lambda s, doc: {"sites": sites(s.an.att, s.focus, s.top, window=s.window)}, _text_sites,
            lambda r: {"sites": r["sites"]}, ("tables",)),
    Section("ops", lambda s, doc: {"ops": ops(s.an.att, s.focus, s.top, window=s.window)}, _text_ops),
    Section("timeline", lambda s, doc: {"timeline": category_timeline(s.an.att, s.an.tl, window=s.window)}),
    Section("warnings", _build_warnings, lambda r, top: [f"warning: {w}" for w in r["warnings"]],
            lambda r: {"warnings": r["warnings"]}, ("header",)),
    Section("module_classes", _build_module_classes),
    Section("allocator", _build_allocator, lambda r, top: allocator_lines(r.get("allocator"), top)),
    Section("serving", _build_serving, _text_serving, lambda r: {"serving": r.get("serving")}, ("tables",)),
    Section("oom", _build_oom, lambda r, top: oom_lines(r.get("oom"), top), lambda r: {"oom": r.get("oom")},
            ("allocatorFigures",)),
)
