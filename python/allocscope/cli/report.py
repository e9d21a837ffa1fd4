"""allocscope report: the peak explained, from the textbook estimate to the
measured bytes."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .._units import format_bytes

NAME = "report"
HELP = "explain the peak (or a mark): categories, modules, sites, theory vs practice"
DESCRIPTION = """\
Explain where the memory went at the peak of allocated memory (or, with --at,
at the first mark with that label): bytes live by category (parameter,
gradient, optimizer state, activation, temporary, ...), by module and by
source line, and the waterfall from the textbook estimate (parameters +
gradients + optimizer state + activations) to what was measured, line by line:
each category's difference, allocator rounding, cached free memory, and memory
outside PyTorch's allocator. Categories need a watched model
(`rec.watch(model, optimizer)`); see docs/attribution.md. Sizes are in binary
units (KiB = 1024 B). --json prints the same as JSON (schema: docs/report.md).

examples:
  allocscope report step.alsc
  allocscope report step.alsc --at after-forward
  allocscope report --json step.alsc | jq '.gap'
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="capture file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--at", metavar="LABEL", help="report at the first mark with this label instead of the peak")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="rows in each table (default 10)")


def run(args: argparse.Namespace) -> int:
    from .. import load
    from ..analysis.report import MarkNotFound, build_report

    if args.top < 1:
        raise ValueError("--top must be at least 1")
    cap = load(args.file)
    try:
        report = build_report(cap, at=args.at, top=args.top)
    except MarkNotFound as e:
        raise ValueError(str(e)) from None
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render(report, args.top))
    return 0


def _table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


def _shorten(site: str, width: int = 70) -> str:
    path, _, rest = site.partition(":")
    if len(site) <= width:
        return site
    return "..." + os.sep + os.path.basename(path) + ":" + rest


def render(r: dict[str, Any], top: int = 10) -> str:
    focus = r.get("at") or r["peak"]
    where = f"at mark {focus['label']!r}" if "at" in r else "at the peak of allocated memory"
    cap = r["capture"]
    lines = [f"{cap['path']}: {cap['device_type']}, {cap['events']} events, "
             f"{cap['duration_ns'] / 1e9:.2f} s{'' if cap['complete'] else ' (incomplete)'}"]
    if not cap["watched"]:
        lines.append("no model was watched: categories and the estimate need rec.watch(model, optimizer)")
    lines.append("")
    head = f"Memory {where} ({focus['time_ns'] / 1e9:.3f} s in, event {focus['event']}): " \
           f"{format_bytes(focus['allocated_bytes'])} allocated"
    if focus.get("reserved_bytes") is not None:
        head += f", {format_bytes(focus['reserved_bytes'])} reserved"
    lines.append(head)

    th = r["theory"]
    lines += ["", "Theory vs practice (textbook estimate -> measured):"]
    rows = [("estimate", format_bytes(th["total"]), "parameters + gradients + optimizer state + "
             "activations x2 + inputs" if th["training"] else "parameters + activations + inputs")]
    running = th["total"]
    for item in r["gap"]:
        if item["bytes"] == 0:
            continue
        running += item["bytes"]
        sign = "+" if item["bytes"] >= 0 else "-"
        rows.append((f"{sign} {item['item']}", format_bytes(abs(item["bytes"])), item["detail"]))
    m = r["measured"]
    rows.append(("= measured", format_bytes(m["total_bytes"]), m["basis"].replace("_", " ")))
    lines += _table(rows, {1})
    for note in th["notes"]:
        lines.append(f"  note: {note}")

    lines += ["", "By category (requested bytes):"]
    cats = [(c, format_bytes(b)) for c, b in sorted(focus["by_category"].items(), key=lambda kv: -kv[1]) if b]
    lines += _table(cats, {1}) if cats else ["  (nothing live)"]
    lines += ["", "By module:"]
    mods = [(mname, format_bytes(b)) for mname, b in list(focus["by_module"].items())[:top]]
    lines += _table(mods, {1}) if mods else ["  (nothing live)"]
    lines += ["", "Largest groups (category, module, source line):"]
    groups = [(format_bytes(g["bytes"]), str(g["count"]), g["category"], g["module"] or "-", _shorten(g["site"]))
              for g in focus["top"][:top]]
    lines += _table([("bytes", "n", "category", "module", "site")] + groups, {0, 1}) if groups else ["  (none)"]
    if r["sites"]:
        lines += ["", "Top allocation sites (live here, allocated in all):"]
        lines += _table([("live", "allocated", "count", "site")] + [
            (format_bytes(s["live_bytes"]), format_bytes(s["allocated_bytes"]), str(s["allocations"]),
             _shorten(s["site"])) for s in r["sites"][:top]], {0, 1, 2})
    its = r["iterations"]
    if its:
        lines += ["", "Iterations (optimizer steps):"]
        lines += _table([("iter", "peak", "growth", "leaked")] + [
            (str(i["iteration"]), format_bytes(i["peak_allocated_bytes"]), format_bytes(i["growth_bytes"]),
             format_bytes(i["leaked_bytes"])) for i in its[:top]], {0, 1, 2, 3})
        if len(its) > top:
            lines.append(f"  ... {len(its) - top} more (--json for all)")
    lines += _allocator_lines(r.get("allocator"), top)
    lines += _oom_lines(r.get("oom"), top)
    for w in r["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _allocator_lines(a: dict[str, Any] | None, top: int) -> list[str]:
    if not a:
        return []
    lines = ["", f"Allocator (settings: {a['settings']}), at the peak of reserved memory (event {a['state_at']}):"]
    st = a.get("state")
    if st:
        lines += _table([
            ("reserved", format_bytes(st["reserved"]), f"{st['segments']} segments"),
            ("allocated", format_bytes(st["allocated"]), f"of which rounding and unsplit remainders "
             f"{format_bytes(st['internal_fragmentation'])}"),
            ("cached free", format_bytes(st["cached_free"]), f"largest block {format_bytes(st['largest_free_block'])}, "
             f"external fragmentation {st['external_fragmentation']:.1%}"),
            ("unreleasable", format_bytes(st["unreleasable_free"]), f"free inside {st['fragmented_segments']} "
             "segments that also hold live blocks (empty_cache cannot return it)"),
            ("awaiting streams", format_bytes(st["pending_free"]), "freed, still in use by another stream"),
        ], {1})
        for seg in st["pinned_segments"][:3]:
            lines.append(f"  segment {seg['address']:#x} ({format_bytes(seg['total_size'])}, {seg['pool']} pool): "
                         f"{format_bytes(seg['free'])} free, pinned by {seg['live_blocks']} live block(s):")
            for p in seg["pinned_by"][:3]:
                what = " ".join(x for x in (p.get("category"), p.get("module"), p.get("tensor")) if x)
                lines.append(f"    {format_bytes(p['size'])} {what or p['state']} {p.get('site') or ''}".rstrip())
    rp = a.get("replay")
    if rp:
        verdict = "reproduced exactly" if rp["exact"] else \
            f"NOT reproduced exactly ({rp['matched']} of {rp['recorded_segment_events']} segment events)"
        lines.append(f"  replay of the allocator: {verdict}; see `allocscope simulate`")
    return lines


def _oom_lines(o: dict[str, Any] | None, top: int) -> list[str]:
    if not o:
        return []
    req = o["request"]
    lines = ["", f"Out of memory at event {o['event']}: requested {format_bytes(req['size'])}"]
    lines += [f"    {f}" for f in req["stack"][:5]]
    if not o["reproduced_by_replay"]:
        return lines + [f"  {o['note']}"]
    al, dev = o["allocator"], o["device"]
    rows = [("reserved", format_bytes(al["reserved"]), f"allocated {format_bytes(al['allocated'])}")]
    if dev.get("outside_pytorch") is not None:
        rows.append(("outside PyTorch", format_bytes(dev["outside_pytorch"]), "CUDA context, libraries, other processes"))
    rows.append(("device free", format_bytes(dev["free_at_oom"]), f"of {format_bytes(dev['total'] or 0)}"
                 + (f"; allowed {format_bytes(dev['allowed'])}" if dev.get("allowed") else "")))
    lines += _table(rows, {1})
    unusable = {k: v for k, v in o["cached_unusable"].items() if v}
    if unusable:
        lines.append("  cached but unusable for this request: " + ", ".join(
            f"{format_bytes(v)} {k.replace('_', ' ')}" for k, v in unusable.items()))
    filled = (o.get("filled_by") or {}).get("categories") or {}
    if filled:
        lines.append("  filled by: " + ", ".join(f"{c} {format_bytes(b)}" for c, b in
                                                 sorted(filled.items(), key=lambda kv: -kv[1]) if b))
    if o.get("shortfall") is not None:
        lines.append(f"  short by {format_bytes(o['shortfall'])}; empty_cache() would not have helped "
                     "(torch had released every unsplit cached block)")
    for t in o.get("settings_tried", []):
        lines.append(f"  with {t['settings']}: {'would fit' if t['avoids_oom'] else 'still runs out'} "
                     f"(peak reserved {format_bytes(t['peak_reserved'])})")
    return lines
