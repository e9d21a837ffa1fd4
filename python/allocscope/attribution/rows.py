"""The rows of an attribution and the tensor labels that name them.

Every allocation recorded is a row, from its ALLOC to its FREE (or the
end); memory that existed before recording is a row too, live from the
start (the start baseline's blocks, labelled addresses no recorded
allocation covers). A tensor label names the row live at its address when
it was written (categories.py gives the rows their meaning).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ..capture.reader import Capture
from ..common.native import analysis_for
from .lifetimes import lifetimes

__all__ = ["Rows", "join_labels"]


class Rows:
    """The rows' columns, built in parts: recorded allocations, then memory
    from before recording (the start baseline's blocks, labelled addresses)."""

    COLUMNS = ("addr", "size", "block", "start", "end", "stack", "op", "thread", "device")

    def __init__(self, cap: Capture, n: int, block_sizes: np.ndarray | None):
        ev = cap.events
        lt = lifetimes(ev)
        self.n = n
        blocks = ev.block if block_sizes is None else block_sizes
        self.parts: dict[str, list[np.ndarray]] = {
            "addr": [ev.addr[lt.alloc].astype(np.uint64, copy=False)], "size": [ev.size[lt.alloc].astype(np.int64)],
            "block": [blocks[lt.alloc].astype(np.int64)], "start": [lt.alloc.astype(np.int64, copy=False)],
            "end": [np.where(lt.free >= 0, lt.free, n).astype(np.int64)],
            "stack": [ev.stack[lt.alloc].astype(np.int64)], "op": [ev.op[lt.alloc].astype(np.int64)],
            "thread": [ev.thread[lt.alloc].astype(np.int64)], "device": [ev.device[lt.alloc].astype(np.int64)]}
        self._joined: dict[str, tuple[int, np.ndarray]] = {}  # column -> (parts joined, the column)
        self.unmatched_frees_at: dict[int, list[int]] = {}  # address -> FREEs of memory from before recording
        for i in lt.unmatched_frees.tolist():
            self.unmatched_frees_at.setdefault(int(ev.addr[i]), []).append(i)

    def free_after(self, a: int, index: int) -> int:
        """The first FREE of older memory at address a after event index (n: none)."""
        frees = self.unmatched_frees_at.get(a, ())
        k = bisect.bisect_right(frees, index)
        return frees[k] if k < len(frees) else self.n

    def add_older(self, addr: list[int], size: list[int], block: list[int] | None, end: list[int],
                  device: list[int] | int) -> None:
        """Rows of memory that existed before recording (live from the start)."""
        k = len(addr)
        new = {"addr": np.array(addr, np.uint64), "size": np.array(size, np.int64),
               "block": np.array(block, np.int64) if block is not None else np.zeros(k, np.int64),
               "start": np.full(k, -1, np.int64), "end": np.array(end, np.int64), "stack": np.zeros(k, np.int64),
               "op": np.zeros(k, np.int64), "thread": np.zeros(k, np.int64),
               "device": np.array(device, np.int64) if isinstance(device, list) else np.full(k, device, np.int64)}
        for c in self.COLUMNS:
            self.parts[c].append(new[c])

    def column(self, name: str) -> np.ndarray:
        """The column over every part (parts[c][0] stays the recorded rows)."""
        parts = self.parts[name]
        if len(parts) == 1:
            return parts[0]
        joined = self._joined.get(name)
        if joined is None or joined[0] != len(parts):  # joined once, until rows are added again
            joined = self._joined[name] = (len(parts), np.concatenate(parts))
        return joined[1]

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts["addr"])


def join_labels(ev: Any, rows: Rows, label_idx: np.ndarray, device_type: str, warnings: list[str],
                 engine: str = "auto") -> np.ndarray:
    """The row each tensor label (events label_idx) names, -1 for none: the
    row live at its address when it was written (of the rows there, the one
    that started last at or before it), or a new row of memory from before
    recording where nothing recorded was there yet. engine: "native" (one
    pass with a hash map, allocscope._analysis.label_allocs), "numpy" (the
    reference, by sorts) or "auto" (native where built and the events are in
    sequence order, as lifetimes() takes them)."""
    label_rows = np.full(len(label_idx), -1, np.int64)
    if not len(label_idx):
        return label_rows
    A, ST, EN = rows.column("addr"), rows.column("start"), rows.column("end")
    la = ev.addr[label_idx].astype(np.uint64)
    fast = analysis_for(engine, "numpy")
    if fast is not None and (engine == "native" or ev.in_sequence_order()):
        found, live = _label_rows_native(fast, ev, rows, label_idx, label_rows, A, EN)
    else:
        found, live = _label_rows_numpy(label_idx, label_rows, la, A, ST, EN)
    return _older_labels(ev, rows, label_idx, label_rows, la, A, found, live, device_type, warnings)


def _label_rows_native(fast: Any, ev: Any, rows: Rows, label_idx: np.ndarray, label_rows: np.ndarray,
                       A: np.ndarray, EN: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_label_rows_numpy's (found, live), from one pass over the events:
    recorded rows are the ALLOCs in event order (Rows), so the position of
    the ALLOC open at a label's address is its row; where none came before,
    a row of memory from before recording there (start -1) is the candidate."""
    pos = fast.label_allocs(np.ascontiguousarray(ev.kind, np.uint8), np.ascontiguousarray(ev.addr, np.uint64),
                            np.ascontiguousarray(label_idx, np.int64))
    open_ = pos >= 0
    label_rows[open_] = pos[open_]
    found, live = pos != -2, open_.copy()
    recorded = len(rows.parts["start"][0])
    older = {int(a): r for r, a in enumerate(A[recorded:].tolist(), start=recorded)}
    for j in np.flatnonzero(pos == -2).tolist():
        r = older.get(int(ev.addr[label_idx[j]]))
        if r is not None:
            found[j] = True
            if EN[r] > label_idx[j]:
                live[j], label_rows[j] = True, r
    return found, live


def _label_rows_numpy(label_idx: np.ndarray, label_rows: np.ndarray, la: np.ndarray, A: np.ndarray,
                      ST: np.ndarray, EN: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found, live) per label: a row at its address started at or before it,
    and that row still live; label_rows gets the live ones' rows."""
    none = np.zeros(len(label_idx), bool)
    if not len(A):  # no rows at all (a recording that allocated nothing)
        return none, none.copy()
    # One sorted key per (address, start) over the rows at labelled addresses;
    # a label's key (address, its index) finds the last row started by then.
    uniq = np.unique(la)
    # The rows at labelled addresses, and their address's rank: one binary
    # search per row (np.isin sorted every row with the labels: 1.3 s of a
    # late step's report on 3.9M rows).
    rank = np.searchsorted(uniq, A)
    there = rank < len(uniq)
    there[there] = uniq[rank[there]] == A[there]
    sel = np.flatnonzero(there)
    if not len(sel):  # no row at any labelled address (memory from before recording, on the CPU)
        return none, none.copy()
    row_addr = rank[sel]
    span = int(max(ST.max(initial=-1), label_idx.max())) + 2
    order = np.lexsort((sel, EN[sel], ST[sel], row_addr))
    row_keys = row_addr[order] * span + (ST[sel][order] + 1)
    label_addr = np.searchsorted(uniq, la)
    pos = np.searchsorted(row_keys, label_addr * span + (label_idx.astype(np.int64) + 1), side="right") - 1
    found = pos >= 0
    found[found] = row_addr[order][pos[found]] == label_addr[found]  # a row there started at or before it
    cand = np.where(found, sel[order][np.maximum(pos, 0)], 0)
    live = found & (EN[cand] > label_idx)
    label_rows[live] = cand[live]
    return found, live


def _older_labels(ev: Any, rows: Rows, label_idx: np.ndarray, label_rows: np.ndarray, la: np.ndarray,
                  A: np.ndarray, found: np.ndarray, live: np.ndarray, device_type: str,
                  warnings: list[str]) -> np.ndarray:
    """Labels with no row at their address yet: rows of memory from before
    recording, made here; the labels no row explains, counted in a warning."""
    # Labels with no row there yet name memory from before recording (one
    # new row per address, live until its first recorded free); the others
    # name memory already freed.
    extra: list[tuple[int, int, int]] = []  # (addr, size, end)
    extra_at: dict[int, tuple[int, int]] = {}  # address -> (end, row)
    unmatched = 0
    for j in np.flatnonzero(~live & ~found).tolist():
        a, i = int(la[j]), int(label_idx[j])
        have = extra_at.get(a)
        if have is None:
            e = rows.free_after(a, i)
            have = extra_at[a] = (e, len(A) + len(extra))
            extra.append((a, int(ev.size[i]), e))
        if have[0] > i:
            label_rows[j] = have[1]
        else:
            unmatched += 1
    unmatched += int(np.count_nonzero(found & ~live))
    if unmatched:
        warnings.append(f"{unmatched} tensor labels name no live allocation (memory from outside "
                        "the recorded allocators, or events lost)")
    if extra:
        rows.add_older([a for a, _, _ in extra], [s for _, s, _ in extra], None, [e for _, _, e in extra],
                       -1 if device_type == "cpu" else 0)
    return label_rows
