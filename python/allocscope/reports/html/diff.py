"""The diff of two captures as a static HTML page (no script): the tables of
reports/diff.py with bars for A and B, in the report's styles."""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

from ...common.units import format_bytes
from ..diff import SECTIONS, ratio_text

__all__ = ["render_diff"]


def render_diff(d: dict[str, Any], top: int) -> str:
    """A static page (no script): the tables with bars for A and B."""
    css = resources.files(__package__).joinpath("report.css").read_text(encoding="utf-8")
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
             f"content=\"default-src 'none'; style-src 'unsafe-inline'\"><title>allocscope diff</title><style>{css}"
             ".bar{height:8px;display:block;border-radius:2px}.a{background:#98a2b3}.b{background:#2f6feb}"
             "td.up{color:#c4320a}td.down{color:#027a48}</style></head><body><header><h1>allocscope diff</h1>"
             f"<div class='sub'>A: {e(d['a']['path'])}<br>B: {e(d['b']['path'])}</div></header><main>"]
    for title, key in SECTIONS:
        rows = d[key][:top]
        biggest = max([max(r["a"], r["b"]) for r in rows] + [1])
        parts.append(f"<section id='{key}'><h2>{e(title)}</h2><table><tr><th></th><th class='num'>A</th>"
                     "<th class='num'>B</th><th class='num'>B - A</th><th class='num'>B / A</th><th></th></tr>")
        for r in rows:
            cls = "up" if r["delta"] > 0 else "down" if r["delta"] < 0 else ""
            bars = (f"<span class='bar a' style='width:{200 * r['a'] / biggest:.0f}px'></span>"
                    f"<span class='bar b' style='width:{200 * r['b'] / biggest:.0f}px'></span>")
            parts.append(f"<tr><td class='site'>{e(r['name'])}</td><td class='num'>{format_bytes(r['a'])}</td>"
                         f"<td class='num'>{format_bytes(r['b'])}</td><td class='num {cls}'>"
                         f"{'+' if r['delta'] > 0 else ''}{format_bytes(r['delta'])}</td><td class='num'>{ratio_text(r)}</td>"
                         f"<td>{bars}</td></tr>")
        parts.append("</table></section>")
    parts += [f"<div class='warn'>{e(w)}</div>" for w in d["warnings"]]
    return "".join(parts) + "</main></body></html>"
