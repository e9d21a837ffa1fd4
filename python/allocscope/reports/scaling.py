"""Is memory proportional to batch size? From the runs `fit --search` makes
anyway, the card's memory at its peak as a function of the searched value:
a fixed part and a part per unit, each split by what holds it, and the
values at which the caching allocator's behaviour changes (memory_model;
the search document's `memory`, docs/report.md).

The card's memory at the peak is split, per run that fit, into parts that
sum to it exactly:

    outside the allocator   the CUDA context and libraries (read at the end)
    each category           requested bytes at the peak of allocated memory
    allocator rounding      the blocks' sizes above those requests
    cached and fragmented   peak reserved - peak allocated: free blocks the
                            allocator keeps, whole segments held for a few
                            live blocks

Each part is fitted with a line, fixed + per_unit * value, by least squares
over those runs; where the memory is not proportional the line bends, and
the residuals say by how much and in which part (usually the cached one:
segments come whole). With two runs the line is exact and nothing says
whether it bends.

Where the allocator's behaviour changes with the value: the largest request
of what grows (outside parameters, buffers, gradients, optimizer state and
workspaces) crosses the caching allocator's size classes (c10's constants,
allocator/sizes.py): above 1 MiB a request comes from the large pool's 20 MiB
segments instead of the small pool's 2 MiB ones; from 10 MiB it gets a
segment of its own (its size rounded to 2 MiB), where a freed one is reused
only by requests that fit in it; above max_split_size (where set) a block is
never split."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..allocator.sizes import MIN_LARGE_ALLOC, SIZE_MAX, SMALL_SIZE
from ..attribution.categories import CATEGORIES
from ..common.units import format_bytes

__all__ = ["FIXED_CATEGORIES", "memory_model", "model_lines"]

# What a training step holds whatever its batch (the textbook estimate's
# fixed terms, and what a library keeps per handle); the rest grows or not,
# as the runs say.
FIXED_CATEGORIES = ("parameter", "buffer", "gradient", "optimizer_state", "workspace")

ROUNDING, CACHED, OUTSIDE = "allocator_rounding", "cached_and_fragmented", "outside_allocator"


def _parts(card: dict[str, Any]) -> dict[str, int] | None:
    """A run's memory at its peak, split into parts that sum to it (None
    where the run did not measure all of them)."""
    peak = card.get("peak") or {}
    allocated, reserved = card.get("peak_allocated_bytes"), card.get("peak_reserved_bytes")
    if allocated is None or reserved is None or "by_category" not in peak:
        return None
    by_category = {c: int(peak["by_category"].get(c, 0)) for c in CATEGORIES}
    parts = by_category | {ROUNDING: int(allocated) - sum(by_category.values()),
                           CACHED: int(reserved) - int(allocated),
                           OUTSIDE: int(card.get("outside_allocator_bytes") or 0)}
    return parts


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(fixed, per_unit, largest residual) of the least-squares line (two
    distinct values at least: the callers check)."""
    per_unit, fixed = np.polyfit(x.astype(np.float64), y.astype(np.float64), 1)
    residual = float(np.abs(y - (fixed + per_unit * x)).max())
    return float(fixed), float(per_unit), residual


def memory_model(name: str, points: Sequence[tuple[int, dict[str, Any]]], low: int, high: int) -> dict[str, Any]:
    """The model of a card's memory over the searched value `name` in
    low..high from the card results of its runs, [(value, card), ...]: the
    runs that fit are used (a run that ran out measured no peak)."""
    runs = sorted(((v, p, c) for v, c in points if c.get("verdict") == "fits" and (p := _parts(c)) is not None),
                  key=lambda run: run[0])
    out: dict[str, Any] = {"name": name, "values": [v for v, _, _ in runs]}
    if len({v for v, _, _ in runs}) < 2:
        return out | {"fixed_bytes": None, "per_unit_bytes": None,
                      "why": f"needs two values that fit: {len(runs)} fit among the values run"}
    x = np.array([v for v, _, _ in runs], np.int64)
    measured = np.array([sum(p.values()) for _, p, _ in runs], np.int64)
    fixed, per_unit, residual = _line(x, measured)
    parts: dict[str, dict[str, Any]] = {}
    for part in list(CATEGORIES) + [ROUNDING, CACHED, OUTSIDE]:
        y = np.array([p[part] for _, p, _ in runs], np.int64)
        if not y.any():
            continue
        f, b, r = _line(x, y)
        parts[part] = {"fixed_bytes": int(round(f)), "per_unit_bytes": b, "residual_bytes": int(round(r)),
                       "at_values": y.tolist()}
    out |= {"fixed_bytes": int(round(fixed)), "per_unit_bytes": per_unit, "residual_bytes": int(round(residual)),
            "measured_bytes": measured.tolist(), "parts": parts,
            # proportional where the line misses no run by more than 1% of its memory (or 2 MiB)
            "linear": len(runs) > 2 and residual <= max(0.01 * float(measured.max()), 2 << 20),
            "changes": _changes(runs, low, high)}
    return out


def _changes(runs: list[tuple[int, dict[str, int], dict[str, Any]]], low: int, high: int) -> list[dict[str, Any]]:
    """The values at which the largest growing request crosses one of the
    allocator's size classes (or max_split_size): between two runs on either
    side of it, where the line through them crosses (`between`: those runs);
    elsewhere where the request is exactly proportional over the runs
    (`between` null: the line followed beyond them)."""
    sizes = sorted((v, int(c["largest_growing_request_bytes"])) for v, _, c in runs
                   if c.get("largest_growing_request_bytes") is not None)
    classes = [(SMALL_SIZE, "the largest growing request passes 1 MiB: it comes from the large pool's 20 MiB "
                            "segments, no longer the small pool's 2 MiB ones"),
               (MIN_LARGE_ALLOC - 1, "the largest growing request reaches 10 MiB: each such request gets a segment "
                                     "of its own (rounded to 2 MiB), reused only by requests that fit in it")]
    split = max((int(c.get("max_split_size") or SIZE_MAX) for _, _, c in runs), default=SIZE_MAX)
    if split < SIZE_MAX:
        classes.append((split, f"the largest growing request passes max_split_size ({format_bytes(split)}): "
                               "its blocks are never split"))
    # Where that request is exactly proportional over the runs (a tensor of
    # the batch's shape), its line is followed beyond them too, in low..high.
    exact = None
    if len({v for v, _ in sizes}) >= 2:
        fixed, per_unit, residual = _line(np.array([v for v, _ in sizes], np.int64),
                                          np.array([s for _, s in sizes], np.int64))
        if residual <= 512 and per_unit > 0:
            exact = (fixed, per_unit)
    out = []
    for size, what in classes:
        at, between = None, None
        for (v0, s0), (v1, s1) in zip(sizes, sizes[1:], strict=False):
            if s0 <= size < s1:  # crossed between v0 and v1: the first value above size on their line
                at, between = v0 + int(np.floor((size - s0) * (v1 - v0) / (s1 - s0))) + 1, [v0, v1]
                break
        if at is None and exact is not None:
            x = (size - exact[0]) / exact[1]
            at = int(np.floor(round(x) if abs(x - round(x)) < 1e-6 else x)) + 1  # (a float's error at a whole value)
        if at is not None and low <= at <= high:
            out.append({"value": at, "between": between, "request_bytes": size + 1, "what": what})
    return out


def model_lines(model: dict[str, Any], top: int = 6) -> list[str]:
    """The model as text (indented lines)."""
    name = model["name"]
    if model.get("fixed_bytes") is None:
        return [f"  memory against {name}: {model['why']}"]
    values = ", ".join(str(v) for v in model["values"])
    shape = ("proportional: the line misses no run by more than "
             f"{format_bytes(model['residual_bytes'])}" if model["linear"] else
             "exact through two runs (a third would tell whether it bends)" if len(model["values"]) == 2 else
             f"NOT proportional: the line misses a run by {format_bytes(model['residual_bytes'])}")
    lines = [f"  memory at the peak against {name} (the {len(model['values'])} runs that fit: {values}):",
             f"    {format_bytes(model['fixed_bytes'])} + {format_bytes(round(model['per_unit_bytes']))} "
             f"per {name} ({shape})"]
    parts = model["parts"]
    # what matters: a part of at least 1 MiB (or 0.5% of the memory), fixed or grown over the values run
    span = max(model["values"]) - min(model["values"])
    floor = max(1 << 20, 0.005 * max(model["measured_bytes"]))
    fixed = sorted(((k, p["fixed_bytes"]) for k, p in parts.items() if p["fixed_bytes"] >= floor),
                   key=lambda kv: -kv[1])
    growing = sorted(((k, p["per_unit_bytes"]) for k, p in parts.items() if p["per_unit_bytes"] * span >= floor),
                     key=lambda kv: -kv[1])
    lines.append("    fixed: " + (", ".join(f"{_label(k)} {format_bytes(v)}" for k, v in fixed[:top]) or "nothing"))
    lines.append(f"    per {name}: " + (", ".join(f"{_label(k)} {format_bytes(round(v))}" for k, v in growing[:top])
                                        or "nothing grows"))
    bent = sorted(((k, p["residual_bytes"]) for k, p in parts.items() if p["residual_bytes"] >= floor),
                  key=lambda kv: -kv[1])
    if bent and len(model["values"]) > 2:
        lines.append("    where the line bends: " + ", ".join(f"{_label(k)} (off by up to {format_bytes(v)})"
                                                             for k, v in bent[:top]))
    for change in model["changes"]:
        lines.append(f"    from {name}={change['value']}: {change['what']}")
    return lines


_LABELS = {OUTSIDE: "outside the allocator (CUDA context, libraries)", CACHED: "cached and fragmented",
           ROUNDING: "rounding", "optimizer_state": "optimizer state"}


def _label(part: str) -> str:
    return _LABELS.get(part, part)
