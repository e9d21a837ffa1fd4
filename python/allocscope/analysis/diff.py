"""What changed between two captures (two batch sizes, two commits, two
allocator settings): the peaks, each category's own peak, and the bytes
live at each capture's peak by category, by module and by source line,
matched by name.

Both sides are explained at their own peak of allocated memory, which is
what "how much more memory does B need" means."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..reader import Capture
from .attribution import CATEGORIES
from .memory import _live_series
from .report import Analysis, analyse, build_report

__all__ = ["SCHEMA", "category_peaks", "diff", "diff_reports"]

SCHEMA = "allocscope.diff/1"


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
            out[c] = int(_live_series(att, att.size, rows).max())
    return out


def diff_reports(a: dict[str, Any], b: dict[str, Any], peaks_a: dict[str, int] | None = None,
                 peaks_b: dict[str, int] | None = None) -> dict[str, Any]:
    """The diff of two reports (analysis.report.build_report) and, when
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
    an_a, an_b = analyse(a), analyse(b)
    return diff_reports(build_report(a, top=top, analysis=an_a), build_report(b, top=top, analysis=an_b),
                        category_peaks(an_a), category_peaks(an_b))
