"""allocscope diff: what changed between two captures."""

from __future__ import annotations

import argparse
import html
import json
from typing import Any

from .._units import format_bytes

NAME = "diff"
HELP = "compare two captures: peaks, and bytes by category, module and source line"
DESCRIPTION = """\
Compare two captures of the same program (two batch sizes, before and after a
code change, two allocator settings): the peaks of allocated, requested and
reserved memory and the textbook estimate, then the bytes live at each
capture's peak by category, by module and by source line (matched by name),
largest change first, and the waterfall items from estimate to measured.

examples:
  allocscope diff bs8.alsc bs16.alsc
  allocscope diff before.alsc after.alsc --json | jq '.categories'
  allocscope diff a.alsc b.alsc --html -o diff.html
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="the first capture (A: the baseline)")
    parser.add_argument("b", help="the second capture (B)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON (schema allocscope.diff/1)")
    out.add_argument("--html", action="store_true", help="write an HTML page (to -o, default A-vs-B.html)")
    parser.add_argument("-o", "--output", metavar="PATH", help="with --html: the file to write")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the output file")
    parser.add_argument("--top", type=int, default=15, metavar="N", help="rows per table in text and HTML (default 15)")


def _pct(r: dict[str, Any]) -> str:
    if r["ratio"] is None:
        return "new" if r["b"] else ""
    return f"x{r['ratio']:.2f}"


def _rows(rows: list[dict[str, Any]], top: int) -> list[tuple[str, ...]]:
    return [(format_bytes(r["a"]), format_bytes(r["b"]), ("+" if r["delta"] > 0 else "") + format_bytes(r["delta"]),
             _pct(r), r["name"]) for r in rows[:top]]


def render(d: dict[str, Any], top: int) -> str:
    from .report import _table

    lines = [f"A: {d['a']['path']} ({d['a']['events']} events)", f"B: {d['b']['path']} ({d['b']['events']} events)"]
    for title, key in (("Peaks", "peaks"), ("Each category's own peak", "category_peaks"),
                       ("By category, at each peak", "categories"),
                       ("By module, at each peak", "modules"), ("By source line, live at each peak", "sites"),
                       ("Estimate -> measured items", "gap")):
        lines += ["", title + ":"]
        rows = _rows(d[key], top)
        lines += _table([("A", "B", "B - A", "B / A", "")] + rows, {0, 1, 2, 3}) if rows else ["  (none)"]
        if len(d[key]) > top:
            lines.append(f"  ... {len(d[key]) - top} more (--json for all)")
    lines += [f"warning: {w}" for w in d["warnings"]]
    return "\n".join(lines)


def render_html(d: dict[str, Any], top: int) -> str:
    """A static page (no script): the tables with bars for A and B."""
    from importlib import resources

    css = resources.files("allocscope.html").joinpath("report.css").read_text(encoding="utf-8")
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
             f"content=\"default-src 'none'; style-src 'unsafe-inline'\"><title>allocscope diff</title><style>{css}"
             ".bar{height:8px;display:block;border-radius:2px}.a{background:#98a2b3}.b{background:#2f6feb}"
             "td.up{color:#c4320a}td.down{color:#027a48}</style></head><body><header><h1>allocscope diff</h1>"
             f"<div class='sub'>A: {e(d['a']['path'])}<br>B: {e(d['b']['path'])}</div></header><main>"]
    for title, key in (("Peaks", "peaks"), ("Each category's own peak", "category_peaks"),
                       ("By category, at each peak", "categories"),
                       ("By module, at each peak", "modules"), ("By source line, live at each peak", "sites"),
                       ("Estimate -> measured items", "gap")):
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
                         f"{'+' if r['delta'] > 0 else ''}{format_bytes(r['delta'])}</td><td class='num'>{_pct(r)}</td>"
                         f"<td>{bars}</td></tr>")
        parts.append("</table></section>")
    parts += [f"<div class='warn'>{e(w)}</div>" for w in d["warnings"]]
    return "".join(parts) + "</main></body></html>"


def run(args: argparse.Namespace) -> int:
    import os

    from .. import load
    from ..analysis.diff import diff
    from .html import check_output

    if args.top < 1:
        raise ValueError("--top must be at least 1")
    if args.output and not args.html:
        raise ValueError("-o goes with --html")
    d = diff(load(args.a), load(args.b))
    if args.json:
        print(json.dumps(d, indent=1))
    elif args.html:
        name = lambda p: os.path.splitext(os.path.basename(p))[0]  # noqa: E731
        out = args.output or f"{name(args.a)}-vs-{name(args.b)}.html"
        check_output(out, args.force)
        with open(out, "w", encoding="utf-8") as f:
            f.write(render_html(d, args.top))
        print(f"wrote {out}")
    else:
        print(render(d, args.top))
    return 0
