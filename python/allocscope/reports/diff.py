"""What changed between two captures (two batch sizes, two commits, two
allocator settings): the peaks, each category's own peak, and the bytes
live at each capture's peak by category, by module and by source line,
matched by name (diff; schema SCHEMA, docs/report.md), and as text
(render; the HTML page is html/diff.py).

Both sides are explained at their own peak of allocated memory, which is
what "how much more memory does B need" means."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..attribution.categories import CATEGORIES
from ..attribution.timeline import live_series
from ..capture.reader import Capture
from ..common.units import format_bytes
from .analysis import Analysis, analyse
from .report import build_report
from .text import table

__all__ = ["SCHEMA", "SECTIONS", "category_peaks", "diff", "diff_reports", "ratio_text", "render"]

SCHEMA = "allocscope.diff/1"
# The tables of a diff, in order: (title, key in the document).
SECTIONS = (("Peaks", "peaks"), ("Each category's own peak", "category_peaks"),
            ("By category, at each peak", "categories"), ("By module, at each peak", "modules"),
            ("By source line, live at each peak", "sites"), ("Estimate -> measured items", "gap"))


def _row(name: str, a: int | None, b: int | None) -> dict[str, Any]:
    a0, b0 = a or 0, b or 0
    return {"name": name, "a": a0, "b": b0, "delta": b0 - a0, "ratio": (b0 / a0) if a0 > 0 and b0 >= 0 else None}


def _rows(a: dict[str, int], b: dict[str, int]) -> list[dict[str, Any]]:
    rows = [_row(k, a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b])]
    return sorted(rows, key=lambda r: (-abs(r["delta"]), -max(r["a"], r["b"]), r["name"]))


def _side(r: dict[str, Any]) -> dict[str, Any]:
    c, p = r["capture"], r["peak"]
    return {"path": c["path"], "events": c["events"], "device_type": c["device_type"],
            "peak_allocated": p["allocated_bytes"], "peak_requested": p["requested_bytes"],
            "peak_reserved": (r.get("peak_reserved") or {}).get("reserved_bytes"),
            "estimate": r["theory"]["total"], "iterations": len(r["iterations"])}


def category_peaks(an: Analysis) -> dict[str, int]:
    """Each category's own highest bytes live over the capture (the overall
    peak can fall where a category is low: activations peak in forward,
    optimizer temporaries in the step)."""
    att = an.att
    out = {}
    for i, c in enumerate(CATEGORIES):
        rows = np.flatnonzero(att.category == i)
        if len(rows):
            out[c] = int(live_series(att, att.size, rows).max())
    return out


def diff_reports(a: dict[str, Any], b: dict[str, Any], peaks_a: dict[str, int] | None = None,
                 peaks_b: dict[str, int] | None = None) -> dict[str, Any]:
    """The diff of two reports (reports.report.build_report) and, when
    given, of their categories' own peaks (category_peaks)."""
    sa, sb = _side(a), _side(b)
    peaks = [_row(k, sa[k], sb[k]) for k in ("peak_allocated", "peak_requested", "peak_reserved", "estimate")
             if sa[k] is not None or sb[k] is not None]
    sites_a = {s["site"]: s["live_bytes"] for s in a["sites"]}
    sites_b = {s["site"]: s["live_bytes"] for s in b["sites"]}
    gap_a = {g["item"]: g["bytes"] for g in a["gap"]}
    gap_b = {g["item"]: g["bytes"] for g in b["gap"]}
    return {
        "schema": SCHEMA, "units": "bytes", "a": sa, "b": sb, "peaks": peaks,
        "category_peaks": [r for r in _rows(peaks_a or {}, peaks_b or {}) if r["a"] or r["b"]],
        "categories": [r for r in _rows(a["peak"]["by_category"], b["peak"]["by_category"]) if r["a"] or r["b"]],
        "modules": _rows(a["peak"]["by_module"], b["peak"]["by_module"]),
        "sites": [r for r in _rows(sites_a, sites_b) if r["a"] or r["b"]],
        "gap": [r for r in _rows(gap_a, gap_b) if r["a"] or r["b"]],
        "warnings": [f"A: {w}" for w in a["warnings"]] + [f"B: {w}" for w in b["warnings"]],
    }


def diff(a: Capture, b: Capture, *, top: int = 1000) -> dict[str, Any]:
    """The diff document of two captures (what `allocscope diff --json` prints)."""
    an_a, an_b = analyse(a), analyse(b)
    return diff_reports(build_report(a, top=top, analysis=an_a), build_report(b, top=top, analysis=an_b),
                        category_peaks(an_a), category_peaks(an_b))


def ratio_text(r: dict[str, Any]) -> str:
    """A row's B / A as text ('new' where A had none)."""
    if r["ratio"] is None:
        return "new" if r["b"] else ""
    return f"x{r['ratio']:.2f}"


def _text_rows(rows: list[dict[str, Any]], top: int) -> list[tuple[str, ...]]:
    return [(format_bytes(r["a"]), format_bytes(r["b"]), ("+" if r["delta"] > 0 else "") + format_bytes(r["delta"]),
             ratio_text(r), r["name"]) for r in rows[:top]]


def render(d: dict[str, Any], top: int) -> str:
    """The diff as text, `top` rows per table."""
    lines = [f"A: {d['a']['path']} ({d['a']['events']} events)", f"B: {d['b']['path']} ({d['b']['events']} events)"]
    for title, key in SECTIONS:
        lines += ["", title + ":"]
        rows = _text_rows(d[key], top)
        lines += table([("A", "B", "B - A", "B / A", "")] + rows, {0, 1, 2, 3}) if rows else ["  (none)"]
        if len(d[key]) > top:
            lines.append(f"  ... {len(d[key]) - top} more (--json for all)")
    lines += [f"warning: {w}" for w in d["warnings"]]
    return "\n".join(lines)
