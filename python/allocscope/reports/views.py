"""What the HTML report draws, reduced to a size a browser opens at once:
timelines downsampled so that no peak is smoothed away, trees of live
memory at one moment (by Python stack and by module), the allocator's
segments at one moment, and tables of sites and leaks.

Every function returns JSON-ready data; none returns per-event arrays, so
a capture of 10 million events becomes a few hundred kilobytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..allocator.segments import SegmentInfo
from ..capture.baselines import device_readings, outside_allocator
from ..attribution.categories import CATEGORIES, Attribution, module_label
from ..attribution.timeline import PERSISTENT, Timeline, bucket_peaks, iterations, live_at, relative_time, site_labels
from ..capture.format import EventKind
from ..capture.reader import Capture
from ..capture.stacks import frame_runs, is_library
from .allocator import block_rows

__all__ = ["leaks", "marks", "module_tree", "segments_view", "stack_tree", "timeline_view"]

_OTHER_MODULES = "(other modules)"
_NO_MODULE = "<no module>"


def _series_at(att: Attribution, rows: np.ndarray, picks: np.ndarray) -> list[int]:
    return live_at(att, att.size, rows, picks).tolist()


def timeline_view(att: Attribution, tl: Timeline, *, points: int = 2000, modules: int = 8) -> dict[str, Any]:
    """Bytes live over time at up to `points` moments (each the highest
    moment of allocated memory in its slice of the events), allocated by
    category and by module (the `modules` largest at their own peaks; the
    rest summed), reserved, and device memory in use (CUDA)."""
    n = att.n_events
    picks = bucket_peaks(tl.allocated, points)
    # The global peaks always survive downsampling: they are some slice's maximum.
    out: dict[str, Any] = {"event": (picks - 1).tolist(), "allocated": tl.allocated[picks].tolist(),
                           "requested": tl.requested[picks].tolist()}
    ev = att.capture.events
    t0 = int(att.capture.metadata.get("start_monotonic_ns") or (ev.time_ns[0] if len(ev) else 0))
    times = np.zeros(n + 1, np.int64)
    if n:
        times[1:] = np.maximum(ev.time_ns.astype(np.int64) - t0, 0)
        # The axis starts where the series first move (the first allocation,
        # or segment), not where recording started: the imports and set-up
        # before it would take most of the width.
        moved = tl.allocated[1:] != tl.allocated[:-1]
        if tl.reserved is not None:
            moved |= tl.reserved[1:] != tl.reserved[:-1]
        first = np.flatnonzero(moved)
        if len(first):
            times = np.maximum(times, times[first[0] + 1])
    out["time_ns"] = times[picks].tolist()
    # The moment the page's axis starts at (either axis): the last before
    # memory first moves, as time_ns starts there.
    still = tl.allocated[picks] == tl.allocated[picks[0]]
    if tl.reserved is not None:
        still &= tl.reserved[picks] == tl.reserved[picks[0]]
    out["start"] = int(np.argmin(still)) - 1 if not still.all() else len(picks) - 1
    if tl.reserved is not None:
        out["reserved"] = tl.reserved[picks].tolist()
        base = device_readings(att.capture)
        outside = outside_allocator(base) if base else None
        if outside is not None:
            out["device_used"] = (tl.reserved[picks] + outside).tolist()
            out["device_total"] = sum(int(d.get("total", 0)) for d in base.get("devices") or ())
    by_category = {}
    for i, c in enumerate(CATEGORIES):
        rows = np.flatnonzero(att.category == i)
        if len(rows):
            by_category[c] = _series_at(att, rows, picks)
    out["by_category"] = by_category
    out["by_module"] = _module_series(att, picks, modules) if modules > 0 else {}
    return out


def _module_series(att: Attribution, picks: np.ndarray, keep: int) -> dict[str, list[int]]:
    """Top-level-ish modules: each row's module, the `keep` largest by their
    own peak kept, the rest summed."""
    mods = np.unique(att.module)
    peaks = []
    series = {}
    for m in mods.tolist():
        rows = np.flatnonzero(att.module == m)
        s = live_at(att, att.size, rows, picks)
        series[m] = s
        peaks.append((int(s.max()) if len(s) else 0, m))
    peaks.sort(reverse=True)
    out: dict[str, list[int]] = {}
    rest = np.zeros(len(picks), np.int64)
    classes = att.module_classes
    for rank, (_, m) in enumerate(peaks):
        if rank < keep:
            out[module_label(att.name(m), classes) or _NO_MODULE] = series[m].tolist()
        else:
            rest += series[m]
    if len(peaks) > keep:
        out[_OTHER_MODULES] = rest.tolist()
    return out


def marks(cap: Capture, att: Attribution, *, limit: int = 300) -> list[dict[str, Any]]:
    """MARK events (at most `limit`, evenly chosen) with their time."""
    idx = np.flatnonzero(cap.events.kind == EventKind.MARK)
    if len(idx) > limit:
        idx = idx[np.linspace(0, len(idx) - 1, limit).astype(np.int64)]
    return [{"event": int(e), "time_ns": relative_time(cap, int(e)), "label": cap.label(int(e))} for e in idx.tolist()]


# ---- trees of live memory at one moment


class _Tree:
    """Nodes as [name id, bytes, category id or -1 (mixed), children] with a
    shared name table, so repeated frame names cost one string."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.root: dict[str, Any] = {"name": "all", "bytes": 0, "cat": -2, "kids": {}}

    def add(self, path: list[str], category: int, size: int) -> None:
        node = self.root
        node["bytes"] += size
        node["cat"] = category if node["cat"] in (-2, category) else -1
        for part in path:
            node = node["kids"].setdefault(part, {"name": part, "bytes": 0, "cat": -2, "kids": {}})
            node["bytes"] += size
            node["cat"] = category if node["cat"] in (-2, category) else -1

    def _id(self, name: str) -> int:
        if name not in self._ids:
            self._ids[name] = len(self.names)
            self.names.append(name)
        return self._ids[name]

    def to_json(self, min_fraction: float) -> dict[str, Any]:
        floor = self.root["bytes"] * min_fraction

        def emit(node: dict[str, Any]) -> list[Any]:
            kids = sorted(node["kids"].values(), key=lambda k: -k["bytes"])
            big = [emit(k) for k in kids if k["bytes"] >= floor]
            small = [k for k in kids if k["bytes"] < floor]
            if small:
                big.append([self._id(f"({len(small)} smaller)"), sum(k["bytes"] for k in small), -1, []])
            return [self._id(node["name"]), int(node["bytes"]), max(node["cat"], -1), big]

        return {"names": self.names, "root": emit(self.root), "categories": list(CATEGORIES)}


def _live_groups(att: Attribution, e: int, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    live = np.flatnonzero(att.live(e))
    if not len(live):
        return np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    keys = np.stack([key[live], att.category[live]], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    return uniq, np.bincount(np.asarray(inverse).reshape(-1), weights=att.size[live]).astype(np.int64)


def _frame_path(frames: list[Any], fold_library: bool) -> list[str]:
    """Node names of a stack, outermost first; with fold_library, each run of
    two or more library frames (torch's, allocscope's: stacks.is_library)
    becomes one node named by its innermost frame."""
    names: list[str] = []
    for run in frame_runs(list(reversed(frames)),
                          lambda f: "library" if fold_library and is_library(f.filename) else None):
        if len(run) == 1:
            names.append(f"{run[0].function} ({run[0].filename}:{run[0].line})")
        else:
            names.append(f"{run[-1].function} [+{len(run) - 1} library frame{'s' if len(run) > 2 else ''}]")
    return names or ["<no stack>"]


def stack_tree(att: Attribution, e: int, *, min_fraction: float = 0.001, fold_library: bool = False) -> dict[str, Any]:
    """Live memory after event e as an icicle: root, then the Python stack
    outermost frame first (with fold_library, runs of torch's and
    allocscope's frames as one node each), then the ops that allocated
    (outermost first; in backward the autograd node, under the stack of the
    forward op that made it), then the category. Branches under
    `min_fraction` of the total are folded into one "(n smaller)" node per
    parent."""
    tree = _Tree()
    cap = att.capture
    key = (att.stack.astype(np.int64) << 32) | att.op.astype(np.int64)
    uniq, sizes = _live_groups(att, e, key)
    frames_of: dict[int, list[str]] = {}
    for (k, cat), size in zip(uniq.tolist(), sizes.tolist(), strict=True):
        if k not in frames_of:
            stk, op = k >> 32, k & 0xFFFFFFFF
            path = _frame_path(cap.stack(stk) if stk else [], fold_library)
            frames_of[k] = path + [f.function for f in reversed(cap.stack(op))] if op else path
        tree.add(frames_of[k] + [CATEGORIES[cat]], cat, size)
    return tree.to_json(min_fraction)


def module_tree(att: Attribution, e: int, *, min_fraction: float = 0.001) -> dict[str, Any]:
    """Live memory after event e by module path (`encoder.layers.0` nests
    under `encoder.layers` under `encoder`), then category."""
    tree = _Tree()
    classes = att.module_classes
    uniq, sizes = _live_groups(att, e, att.module.astype(np.int64))
    for (mod, cat), size in zip(uniq.tolist(), sizes.tolist(), strict=True):
        name = att.name(mod)
        parts = name.split(".") if name else [_NO_MODULE]
        # Each node with its module's class where known: "5 (Conv2d)".
        path = [module_label(".".join(parts[:i + 1]), classes, part) for i, part in enumerate(parts)]
        tree.add(path + [CATEGORIES[cat]], cat, size)
    return tree.to_json(min_fraction)


# ---- the allocator's segments


def segments_view(state: list[SegmentInfo], att: Attribution | None, *, limit: int = 400) -> dict[str, Any]:
    """The allocator's segments at one moment (allocator.state.segments()),
    largest first, each block as [offset, size, requested, state, category
    id (-1: free or unknown)]; at most `limit` segments."""
    rows = block_rows(state, att)
    ordered = sorted(state, key=lambda s: (-s.total_size, s.address))
    out = []
    for s in ordered[:limit]:
        blocks = []
        for b in s.blocks:
            row = rows.get(b.address) if b.active else None
            cat = int(att.category[row]) if att is not None and row is not None else -1
            blocks.append([b.address - s.address, b.size, b.requested, b.state, cat])
        out.append({"address": s.address, "size": s.total_size, "stream": s.stream, "pool": s.pool_kind,
                    "expandable": s.is_expandable, "blocks": blocks})
    return {"segments": out, "omitted": max(0, len(state) - limit), "categories": list(CATEGORIES)}


# ---- leaks


def leaks(att: Attribution, tl: Timeline, *, top: int = 50) -> list[dict[str, Any]]:
    """Memory allocated in an iteration followed by another complete one and
    never freed (the rule of attribution.timeline.iterations()), grouped by category,
    module and the user's line, largest first."""
    classes = att.module_classes
    its = iterations(att, tl)
    if len(its) < 3:
        return []
    first, last = its[0]["first_event"], its[-2]["first_event"]  # the last complete iteration's start
    n = att.n_events
    persistent = np.isin(att.category, [CATEGORIES.index(c) for c in PERSISTENT])
    rows = np.flatnonzero((att.start >= first) & (att.start < last) & (att.end >= n) & ~persistent)
    if not len(rows):
        return []
    code, names = site_labels(att, rows)
    groups: dict[tuple[str, str, str], list[int]] = {}
    for r, c in zip(rows.tolist(), code.tolist(), strict=True):
        g = groups.setdefault((CATEGORIES[att.category[r]], module_label(att.name(int(att.module[r])), classes),
                               names[c]), [0, 0, 0])
        g[0] += int(att.size[r])
        g[1] += 1
        g[2] = max(g[2], int(att.iteration[r]))
    ordered = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"category": c, "module": m, "site": s, "bytes": b, "count": k, "last_iteration": it}
            for (c, m, s), (b, k, it) in ordered]

