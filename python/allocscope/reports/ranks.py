"""One report across the ranks of a run (docs/report.md, "ranks"): per rank
its peaks, device use, NCCL's memory and the contexts other processes made
on its card; the worst rank, and where it differs from the median rank
(category, module, source line, each at that rank's peak of allocated
memory); then the usual report of the worst rank. A run's processes
without ranks (spawned workers, an engine process) are compared the same
way, each named by its pid."""

from __future__ import annotations

from typing import Any, Sequence

from ..capture.baselines import closing_baseline
from ..capture.reader import Capture
from ..capture.runs import process_of, rank_of
from ..common.units import format_bytes
from .report import build_report, render
from .text import table

__all__ = ["RANKS_SCHEMA", "build_ranks", "named_by", "render_ranks"]

RANKS_SCHEMA = "allocscope.ranks/1"
# Differences smaller than this are noise of one allocation's rounding.
_MIN_DIFFERENCE = 1 << 20


def _own_card(base: dict[str, Any]) -> dict[str, Any] | None:
    """The card a rank used: where its allocator reserved the most (a rank
    also holds a context on any card it touched, e.g. before set_device)."""
    devices = [d for d in base.get("devices") or () if "used" in d]
    if not devices:
        return None
    return max(devices, key=lambda d: (int((d.get("stats") or {}).get("reserved_bytes", {}).get("current", 0)),
                                       -int(d.get("index", 0))))


def _row(cap: Capture, report: dict[str, Any]) -> dict[str, Any]:
    dist = cap.metadata.get("distributed") or {}
    row: dict[str, Any] = {
        "rank": rank_of(cap.path, cap.metadata), "process": process_of(cap.path, cap.metadata),
        "capture": cap.path,
        "peak_allocated_bytes": report["peak"]["allocated_bytes"],
        "peak_reserved_bytes": (report.get("peak_reserved") or {}).get("reserved_bytes"),
        "device_used_bytes": None, "nccl_bytes": None, "alone": bool(dist.get("alone")),
        "others_faked": bool(dist.get("alone")) or dist.get("ranks_run") is not None,
    }
    base = closing_baseline(cap) or {}
    card = _own_card(base)
    if card is None:
        return row
    row["card"] = int(card.get("index", 0))
    virtual = card.get("virtual") if isinstance(card.get("virtual"), dict) else None
    # The card's use at this rank's peak of reserved memory: what the card
    # held outside this rank's allocator when read (the context, other
    # processes), NCCL's buffers at their most, and the reserved peak.
    reserved_now = int((card.get("stats") or {}).get("reserved_bytes", {}).get("current", 0))
    outside = int(card["used"]) - reserved_now
    if virtual is not None:
        outside += int(virtual.get("nccl_peak", 0)) - int(virtual.get("nccl", 0))
        row["nccl_bytes"] = int(virtual.get("nccl_peak", 0))
        # Contexts other processes created on this rank's card: the classic
        # missing torch.cuda.set_device in another rank.
        others = max(0, int(virtual.get("contexts_created", 0)) - 1)
        row["other_contexts"] = others
        row["other_contexts_bytes"] = others * int(virtual.get("context_bytes", 0))
    if row["peak_reserved_bytes"] is not None:
        row["device_used_bytes"] = row["peak_reserved_bytes"] + outside
    # Cards other than its own where this rank holds memory (a context at least).
    row["stray_cards"] = [int(d.get("index", 0)) for d in base.get("devices") or ()
                          if d is not card and "used" in d and
                          (not isinstance(d.get("virtual"), dict) or int(d["virtual"].get("own", 0)) > 0)]
    return row


def _measure(row: dict[str, Any]) -> tuple[str, int]:
    for key in ("device_used_bytes", "peak_reserved_bytes", "peak_allocated_bytes"):
        if row.get(key) is not None:
            return key, int(row[key])
    return "peak_allocated_bytes", 0


def _breakdown(report: dict[str, Any]) -> dict[tuple[str, str], int]:
    out = {("category", c): int(b) for c, b in report["peak"]["by_category"].items()}
    out |= {("module", m): int(b) for m, b in report["peak"]["by_module"].items()}
    out |= {("line", s["site"]): int(s["live_bytes"]) for s in report.get("sites") or ()}
    return out


def _differences(worst: dict[str, Any], median: dict[str, Any], top: int) -> list[dict[str, Any]]:
    a, b = _breakdown(worst), _breakdown(median)
    rows = [{"dimension": k[0], "name": k[1], "worst_bytes": a.get(k, 0), "median_bytes": b.get(k, 0),
             "difference_bytes": a.get(k, 0) - b.get(k, 0)} for k in dict.fromkeys([*a, *b])]
    rows = [r for r in rows if abs(r["difference_bytes"]) >= _MIN_DIFFERENCE]
    out = []
    for dim in ("category", "module", "line"):
        mine = sorted((r for r in rows if r["dimension"] == dim), key=lambda r: -abs(r["difference_bytes"]))
        out += mine[:top]
    return out


def build_ranks(caps: Sequence[Capture], *, top: int = 10) -> dict[str, Any]:
    """The report across ranks of one run's captures (capture/runs.py checks
    they are one run's)."""
    reports = [build_report(cap, top=max(top, 50)) for cap in caps]
    rows = [_row(cap, r) for cap, r in zip(caps, reports)]
    key = _measure(rows[0])[0]
    order = sorted(range(len(rows)), key=lambda i: (_measure(rows[i])[1], -(rows[i]["rank"] or 0)))
    worst, median = order[-1], order[(len(order) - 1) // 2]
    dist = caps[0].metadata.get("distributed") or {}
    doc: dict[str, Any] = {
        "schema": RANKS_SCHEMA, "units": "bytes",
        "world_size": dist.get("world_size"), "run_id": dist.get("run_id"),
        "ranks": rows, "measure": key,
        "worst_rank": rows[worst]["rank"], "median_rank": rows[median]["rank"],
        "worst_process": rows[worst]["process"], "median_process": rows[median]["process"],
        "worst_capture": rows[worst]["capture"], "median_capture": rows[median]["capture"],
        "worst_over_median_bytes": _measure(rows[worst])[1] - _measure(rows[median])[1],
        "differences": _differences(reports[worst], reports[median], top) if worst != median else [],
        "worst": reports[worst],
    }
    return doc


_MEASURE_NAMES = {"device_used_bytes": "device used", "peak_reserved_bytes": "peak reserved",
                  "peak_allocated_bytes": "peak allocated"}


def _size(n: int | None) -> str:
    return "?" if n is None else format_bytes(n)


def render_ranks(doc: dict[str, Any], top: int = 10) -> str:
    world = doc.get("world_size")
    alone = any(r.get("alone") for r in doc["ranks"])
    noun = named_by(doc)
    n = len(doc["ranks"])
    head = f"allocscope: {n} {noun if n == 1 else _plural(noun)}"
    head += f" of a job of {world}" if world else ""
    if alone:
        head += " (each run alone)"
    elif any(r.get("others_faked") for r in doc["ranks"]):
        head += " (the job's other ranks faked)"
    lines = [head, ""]
    has_virtual = any("other_contexts" in r for r in doc["ranks"])
    header = [noun, "card", "peak allocated", "peak reserved", "device used", "NCCL"]
    if has_virtual:
        header.append("others' contexts on it")
    has_stray = any(r.get("stray_cards") for r in doc["ranks"])
    if has_stray:
        header.append("also on cards")
    rows = [tuple(header + ["capture"])]
    for r in doc["ranks"]:
        cells = [_name(r, noun), f"cuda:{r['card']}" if "card" in r else "?",
                 _size(r["peak_allocated_bytes"]), _size(r["peak_reserved_bytes"]), _size(r["device_used_bytes"]),
                 _size(r.get("nccl_bytes"))]
        if has_virtual:
            n = r.get("other_contexts")
            cells.append("?" if n is None else f"{n} ({format_bytes(r['other_contexts_bytes'])})" if n else "0")
        if has_stray:
            cells.append(", ".join(f"cuda:{c}" for c in r.get("stray_cards") or ()) or "-")
        rows.append(tuple(cells + [r["capture"]]))
    lines += table(rows, set(range(2, len(header))) - {len(header) - 1} if has_stray else set(range(2, len(header))))
    stray = [r for r in doc["ranks"] if r.get("stray_cards")]
    if stray:
        lines.append(f"  {_plural(noun)} holding memory (a CUDA context at least) on "
                     f"another {noun}'s card: "
                     + "; ".join(f"{_process(r)} on {', '.join(f'cuda:{c}' for c in r['stray_cards'])}"
                                 for r in stray)
                     + " (a missing torch.cuda.set_device before the first CUDA call?)")
    measure = _MEASURE_NAMES[doc["measure"]]
    worst = next(r for r in doc["ranks"] if r["capture"] == doc["worst_capture"])
    median = next(r for r in doc["ranks"] if r["capture"] == doc["median_capture"])
    lines.append("")
    if worst is median:
        lines.append(f"the worst {noun} by {measure}: {_process(worst)}")
    else:
        lines.append(f"the worst {noun} by {measure}: {_process(worst)}, "
                     f"{format_bytes(doc['worst_over_median_bytes'])} over the median {noun} ({_name(median, noun)})")
        if doc["differences"]:
            lines.append(f"where it differs from the median {noun} (each at its peak of allocated memory):")
            lines += table([("", "", _process(worst), _process(median), "difference")] +
                           [(d["dimension"], d["name"], format_bytes(d["worst_bytes"]), format_bytes(d["median_bytes"]),
                             ("+" if d["difference_bytes"] > 0 else "-") + format_bytes(abs(d["difference_bytes"])))
                            for d in doc["differences"]], {2, 3, 4})
        else:
            lines.append(f"  no category, module or line differs by 1 MiB or more at the two {_plural(noun)}' peaks: "
                         "the difference is in cached memory or outside the allocator")
        extra = (worst.get("other_contexts") or 0) - (median.get("other_contexts") or 0)
        if extra > 0:
            lines.append(f"  other processes created {extra} more CUDA context{'s' if extra > 1 else ''} on its card "
                         f"({format_bytes(worst['other_contexts_bytes'] - (median.get('other_contexts_bytes') or 0))})")
        nccl = (worst.get("nccl_bytes") or 0) - (median.get("nccl_bytes") or 0)
        if nccl:
            lines.append(f"  NCCL's buffers: {'+' if nccl > 0 else '-'}{format_bytes(abs(nccl))}")
    lines += ["", f"{_process(worst)} (the worst):", render(doc["worst"], top)]
    return "\n".join(lines)


def named_by(doc: dict[str, Any]) -> str:
    """"rank" where every process of the run has one (a job's ranks), else
    "process" (named by pid)."""
    return "rank" if all(r["rank"] is not None for r in doc["ranks"]) else "process"


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith("s") else "s")


def _process(row: dict[str, Any]) -> str:
    """"rank 3", "pid 4242"."""
    return str(row["process"])


def _name(row: dict[str, Any], noun: str) -> str:
    """The process's name in a column headed `noun` (under "rank": its number)."""
    return str(row["rank"]) if noun == "rank" else _process(row)
