"""Live memory over time from an Attribution: timelines, peaks, breakdowns at
any moment, iterations and leaks, allocation sites.

Positions: `e` is an event index; "after event e" includes its effect, and
e = -1 is the moment recording started.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..allocator.recorded import recorded_reserved
from ..capture.reader import Capture
from ..capture.stacks import site
from ..common.arrays import factorize
from .categories import CATEGORIES, Attribution
from .ops import op_names

__all__ = ["PERSISTENT", "Moment", "Timeline", "bucket_peaks", "category_timeline", "iteration_bounds", "iterations", "live_at", "live_series",
           "moment", "op_labels", "ops", "relative_time", "relative_times", "site_labels", "sites", "timeline"]

# Categories that live across iterations by design (never a leak). A
# workspace kept past its iteration is cuBLAS's, one per handle and stream,
# made at the first matmul and kept for the process (cuDNN's are given back
# inside the op that asked): a newcomer's first "leak" otherwise.
PERSISTENT = {"parameter", "buffer", "gradient", "optimizer_state", "workspace"}


@dataclasses.dataclass
class Timeline:
    """Bytes live after each event (index e + 1; index 0 is the start)."""

    requested: np.ndarray
    allocated: np.ndarray  # the allocator's blocks (Attribution.block)
    reserved: np.ndarray | None  # CUDA: bytes the caching allocator holds

    def peak(self, which: str = "allocated") -> int:
        """Event index (-1: the start) where `which` first reaches its maximum."""
        series = getattr(self, which)
        return int(np.argmax(series)) - 1


def live_series(att: Attribution, values: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Sum of `values` over the live rows (all, or `rows`) after each event
    (index e + 1; 0 is the start)."""
    n = att.n_events
    rows = np.arange(att.rows) if rows is None else rows
    delta = np.zeros(n + 1, np.int64)
    start, end, v = att.start[rows], att.end[rows], values[rows]
    delta[0] = v[start < 0].sum()
    recorded = start >= 0
    np.add.at(delta, start[recorded] + 1, v[recorded])
    freed = end < n
    np.add.at(delta, end[freed] + 1, -v[freed])
    return np.cumsum(delta)


def live_at(att: Attribution, values: np.ndarray, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """live_series(att, values, rows)[positions], without the whole series:
    the rows' starts and ends sorted once, each position a binary search."""
    n = att.n_events
    start, end, v = att.start[rows], att.end[rows], values[rows].astype(np.int64)
    older = start < 0
    began = np.argsort(start[~older], kind="stable")
    began_at, began_sum = start[~older][began] + 1, np.concatenate(([0], np.cumsum(v[~older][began])))
    freed = end < n
    ended = np.argsort(end[freed], kind="stable")
    ended_at, ended_sum = end[freed][ended] + 1, np.concatenate(([0], np.cumsum(v[freed][ended])))
    pos = np.asarray(positions, np.int64)
    return (int(v[older].sum()) + began_sum[np.searchsorted(began_at, pos, side="right")]
            - ended_sum[np.searchsorted(ended_at, pos, side="right")])


def bucket_peaks(series: np.ndarray, points: int) -> np.ndarray:
    """Positions (indices into series) of the maximum of each of `points`
    equal slices: the one downsampling of every timeline allocscope draws or
    prints, which keeps every slice's peak (no peak is smoothed away)."""
    n = len(series)
    if n <= points:
        return np.arange(n, dtype=np.int64)
    edges = np.linspace(0, n, points + 1).astype(np.int64).tolist()
    # One argmax per slice: a pass over the series, no padded copy of it.
    return np.array([a + int(np.argmax(series[a:b])) for a, b in zip(edges[:-1], edges[1:])], np.int64)


def timeline(att: Attribution, reserved: np.ndarray | None = None) -> Timeline:
    """Bytes live after each event; on CUDA also the bytes the caching
    allocator held (from the baseline and the recorded segment events, or
    `reserved` where the caller has them: recorded_reserved(capture))."""
    if reserved is None and att.device_type == "cuda":
        reserved = recorded_reserved(att.capture)
    return Timeline(live_series(att, att.size), live_series(att, att.block), reserved)


def _labelled(keys: np.ndarray, name_of: Any) -> tuple[np.ndarray, list[str]]:
    """(code per row, labels): name_of(unique key row) names each distinct
    key; keys with the same name share a code."""
    if not len(keys):
        return np.zeros(0, np.int64), []
    # The key rows in lexicographic order, as np.unique(axis=0) gives them,
    # without its row-wise sort: each column factorised in turn.
    code, m = np.zeros(len(keys), np.int64), 1
    for c in range(keys.shape[1]):
        column, inv = factorize(keys[:, c])
        combined, code = factorize(code * len(column) + inv)
        m = len(combined)
    first = np.empty(m, np.int64)
    first[code] = np.arange(len(code))  # a row of each key (any: they are equal)
    index: dict[str, int] = {}
    codes = np.array([index.setdefault(name, len(index)) for name in map(name_of, keys[first].tolist())], np.int64)
    return codes[code], list(index)


def site_labels(att: Attribution, rows: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The user's line of each row (an index into the returned labels). An
    allocation made in backward, whose stack is that of the forward op that
    made its autograd node, says so: `model.py:47 (forward) [backward:
    ConvolutionBackward0]`. Memory from before recording has no stack."""
    keys = np.stack([att.stack[rows], att.op[rows], att.start[rows] < 0], axis=1)
    ops = op_names(att.capture, att.op[rows])
    stacks: dict[int, str] = {}

    def name(key: list[int]) -> str:
        stk, op, older = key
        if older:
            return "<before recording>"
        if stk not in stacks:
            stacks[stk] = (site(att.capture, stk) if stk else None) or "<no stack>"
        node = ops[op].backward_node
        return f"{stacks[stk]} [backward: {node}]" if node else stacks[stk]

    return _labelled(keys, name)


def op_labels(att: Attribution, rows: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The op that allocated each row, as reports name it (attribution.ops)."""
    ops = op_names(att.capture, att.op[rows])
    return _labelled(att.op[rows][:, None], lambda key: ops[key[0]].name)


@dataclasses.dataclass
class Moment:
    """Live memory at one moment, broken down."""

    event: int
    time_ns: int
    requested_bytes: int
    allocated_bytes: int  # the blocks' sizes
    reserved_bytes: int | None
    by_category: dict[str, int]
    by_module: dict[str, int]
    top: list[dict[str, Any]]
    rounded_bytes: int = 0  # the requests rounded as the allocator rounds them (<= allocated_bytes)
    by_op: dict[str, int] = dataclasses.field(default_factory=dict)  # requested bytes by the op that allocated

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def relative_times(cap: Capture, events: np.ndarray) -> np.ndarray:
    """Nanoseconds from the start of recording to each event (0 for one < 0)."""
    ev = cap.events
    events = np.asarray(events, np.int64)
    if not len(ev):
        return np.zeros(len(events), np.int64)
    t0 = int(cap.metadata.get("start_monotonic_ns") or ev.time_ns[0])
    return np.where(events >= 0, np.maximum(ev.time_ns[np.maximum(events, 0)].astype(np.int64) - t0, 0), 0)


def relative_time(cap: Capture, e: int) -> int:
    """Nanoseconds from the start of recording to event e (0 for e < 0)."""
    return int(relative_times(cap, np.array([e]))[0])


def moment(att: Attribution, e: int, tl: Timeline | None = None, top: int = 20) -> Moment:
    """The breakdown of memory live after event e (by requested bytes)."""
    live = np.flatnonzero(att.live(e))
    size = att.size[live]
    by_category = {c: 0 for c in CATEGORIES}
    sums = np.bincount(att.category[live], weights=size, minlength=len(CATEGORIES))
    for i, c in enumerate(CATEGORIES):
        by_category[c] = int(sums[i])
    by_module: dict[str, int] = {}
    mod_sums = np.bincount(att.module[live] + 1, weights=size)
    for m in np.flatnonzero(mod_sums).tolist():
        by_module[att.name(m - 1) or "<no module>"] = int(mod_sums[m])
    by_module = dict(sorted(by_module.items(), key=lambda kv: -kv[1]))
    op_code, op_label = op_labels(att, live)
    op_sums = np.bincount(op_code, weights=size, minlength=len(op_label))
    by_op = {op_label[i]: int(op_sums[i]) for i in np.argsort(-op_sums, kind="stable")[:top].tolist()}
    # Group by (category, module, the user's line) in numpy.
    site_code, site_label = site_labels(att, live)
    keys = np.stack([att.category[live], att.module[live], site_code], axis=1)
    uniq, inverse = (np.unique(keys, axis=0, return_inverse=True) if len(live)
                      else (np.zeros((0, 3), np.int64), np.zeros(0, np.int64)))
    inverse = np.asarray(inverse).reshape(-1)
    group_bytes = np.bincount(inverse, weights=size, minlength=len(uniq)).astype(np.int64)
    group_count = np.bincount(inverse, minlength=len(uniq))
    groups = {(CATEGORIES[c], att.name(mod), site_label[s]): (b, k)
              for (c, mod, s), b, k in zip(uniq.tolist(), group_bytes.tolist(), group_count.tolist(), strict=True)}
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    tl = tl or timeline(att)
    return Moment(
        event=e, time_ns=relative_time(att.capture, e),
        requested_bytes=int(size.sum()), allocated_bytes=int(att.block[live].sum()),
        reserved_bytes=int(tl.reserved[e + 1]) if tl.reserved is not None else None,
        by_category=by_category, by_module=by_module,
        top=[{"category": c, "module": m, "site": s, "bytes": b, "count": k} for (c, m, s), (b, k) in rows],
        rounded_bytes=int(att.rounded[live].sum()), by_op=by_op)


def iteration_bounds(phase_starts: np.ndarray, phase_iterations: np.ndarray, n: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(iteration number, first event, end event (exclusive)) of each
    iteration in event order: an iteration starts at its first PHASE event
    and ends where the next one starts."""
    keys, first_phase = np.unique(phase_iterations, return_index=True)
    order = np.argsort(phase_starts[first_phase], kind="stable")
    keys, starts = keys[order], phase_starts[first_phase][order].astype(np.int64)
    return keys, starts, np.append(starts[1:], n)


def iterations(att: Attribution, tl: Timeline) -> list[dict[str, Any]]:
    """Per optimizer step: its peak, growth, and the memory it allocated that
    was never freed. Leaked: such memory outside parameters, buffers,
    gradients and optimizer state, from an iteration followed by another
    complete one (what the last step leaves in the script's variables is not
    a leak; what every step leaves is)."""
    if not len(att.phase_starts):
        return []
    n = att.n_events
    keys, starts, ends = iteration_bounds(att.phase_starts, att.phase_iterations, n)
    # Every row by the iteration it was allocated in (-1: before the first).
    owner = np.searchsorted(starts, att.start, side="right") - 1
    persistent = np.isin(att.category, [CATEGORIES.index(c) for c in PERSISTENT])
    retained = (owner >= 0) & (att.end >= n)
    k = len(starts)
    retained_bytes = np.bincount(owner[retained], weights=att.size[retained], minlength=k).astype(np.int64)
    # starts[-1] is the tail after the last optimizer step, starts[-2] the last complete iteration.
    leaked = retained & ~persistent & (owner < k - 2)
    leaked_bytes = np.bincount(owner[leaked], weights=att.size[leaked], minlength=k).astype(np.int64)
    # Each iteration's peak: positions s+1..e of the timeline (after events
    # s..e-1; the iterations tile the events from the first), and the first
    # event after which it was reached.
    allocated = tl.allocated
    window_peak = np.maximum.reduceat(allocated[1:], starts)
    peak_of_event = np.full(n, -1, np.int64)
    peak_of_event[starts[0]:] = np.repeat(window_peak, ends - starts)
    at_peak = np.flatnonzero(allocated[1:] == peak_of_event)
    peak_event = at_peak[np.searchsorted(at_peak, starts)]
    cap = att.capture
    columns = {"iteration": keys, "first_event": starts, "last_event": ends - 1,
               "start_ns": relative_times(cap, starts), "end_ns": relative_times(cap, ends - 1),
               "peak_allocated_bytes": window_peak,
               "peak_time_ns": relative_times(cap, peak_event), "allocated_at_start_bytes": allocated[starts],
               "allocated_at_end_bytes": allocated[ends], "growth_bytes": allocated[ends] - allocated[starts],
               "retained_bytes": retained_bytes, "leaked_bytes": leaked_bytes}
    out = [dict(zip(columns, row)) for row in zip(*(np.asarray(c, np.int64).tolist() for c in columns.values()))]
    return out


def _recorded_table(att: Attribution, at: int, top: int, labels: Any, key: str,
                    window: tuple[int, int] | None) -> list[dict[str, Any]]:
    """Recorded allocations grouped by labels(att, rows): bytes live at event
    `at`, then bytes allocated over the whole capture (or over the events
    window[0]..window[1]; groups with neither are left out)."""
    recorded = np.flatnonzero(att.start >= 0)
    if not len(recorded):
        return []
    code, names = labels(att, recorded)
    size = att.size[recorded]
    counted = np.ones(len(recorded), bool)
    if window is not None:
        counted = (att.start[recorded] >= window[0]) & (att.start[recorded] <= window[1])
    allocated = np.bincount(code[counted], weights=size[counted], minlength=len(names)).astype(np.int64)
    count = np.bincount(code[counted], minlength=len(names))
    live = att.live(at)[recorded]
    live_bytes = np.bincount(code[live], weights=size[live], minlength=len(names)).astype(np.int64)
    order = np.lexsort((-allocated, -live_bytes))
    order = order[(count[order] > 0) | (live_bytes[order] > 0)][:top]
    return [{key: names[i], "allocations": int(count[i]), "allocated_bytes": int(allocated[i]),
             "live_bytes": int(live_bytes[i])} for i in order.tolist()]


def sites(att: Attribution, at: int, top: int = 20, window: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Allocation sites (the user's source line) by bytes live at event `at`,
    then by bytes allocated over the whole capture (or over the events of
    window = (first, last))."""
    return _recorded_table(att, at, top, site_labels, "site", window)


def ops(att: Attribution, at: int, top: int = 20, window: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """The ops that allocated (attribution.ops), ordered as sites()."""
    return _recorded_table(att, at, top, op_labels, "op", window)


def category_timeline(att: Attribution, tl: Timeline, points: int = 256,
                      window: tuple[int, int] | None = None) -> dict[str, Any]:
    """Bytes live per category at up to `points` moments: in each of
    `points` equal slices of the events (those from window[0] to window[1]
    if given), the moment allocated memory is highest (so no peak is
    smoothed away)."""
    if window is None:
        picks_arr = bucket_peaks(tl.allocated, points)  # positions: event index + 1
    else:
        picks_arr = window[0] + 1 + bucket_peaks(tl.allocated[window[0] + 1:window[1] + 2], points)
    out: dict[str, Any] = {"event": (picks_arr - 1).tolist(),
                           "time_ns": [relative_time(att.capture, int(p) - 1) for p in picks_arr],
                           "allocated_bytes": tl.allocated[picks_arr].tolist()}
    if tl.reserved is not None:
        out["reserved_bytes"] = tl.reserved[picks_arr].tolist()
    by_category = {}
    for i, c in enumerate(CATEGORIES):
        rows = np.flatnonzero(att.category == i)
        live = live_at(att, att.size, rows, picks_arr) if len(rows) else None
        if live is not None and live.any():  # the categories seen at these moments
            by_category[c] = live.tolist()
    out["by_category"] = by_category
    return out
