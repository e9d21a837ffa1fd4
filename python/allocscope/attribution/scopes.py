"""The module scope open on the allocating thread when each allocation was
made: MODULE_ENTER/EXIT events replayed per thread (backward scopes too, which
a phase change closes), for the rows no tensor label names a module for
(categories.py, rule 4)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..capture.format import MODULE_BACKWARD, MODULE_RESTORED, EventKind
from ..capture.reader import Capture
from ..common.arrays import factorize, first_index
from ..common.native import analysis_for

__all__ = ["Names", "module_at", "module_scopes", "walk_python"]

_MODULE_KINDS = (EventKind.MODULE_ENTER, EventKind.MODULE_EXIT)


class Names:
    """Names by id, each registered once, in order of registration: the
    ids an attribution's modules and labels are numbered by."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i


def module_at(cap: Capture, event: int) -> str | None:
    """The innermost module scope open on an event's thread when the event
    was written (an OOM's, say), as module_scopes gives allocations theirs;
    None where none was open."""
    names = Names()
    module = np.full(1, -1, np.int64)
    module_scopes(cap, names, np.array([event], np.int64), cap.events.thread[[event]].astype(np.int64), module,
                  np.ones(1, bool))
    return names.names[int(module[0])] if module[0] >= 0 else None


def module_scopes(cap: Capture, names: Any, start: np.ndarray, thread: np.ndarray, module: np.ndarray,
                  which: np.ndarray, *, engine: str = "auto") -> None:
    """Fills module[r] for rows `which` with the innermost module scope open
    on their thread when they were allocated. engine: "native" (C++,
    allocscope._analysis), "python" (walk_python, the reference) or "auto"."""
    ev = cap.events
    idx = np.flatnonzero(np.isin(ev.kind, [int(k) for k in _MODULE_KINDS]) | (ev.kind == EventKind.PHASE))
    if not len(idx):
        return
    symbol_of, decoded = _symbols(cap, names, idx)
    fast = analysis_for(engine, "python")
    if fast is not None:
        at, on, current = fast.walk_scopes(idx.astype(np.int64), ev.thread[idx].astype(np.int64), symbol_of,
                                           decoded, list(names.names))
    else:
        at, on, current = walk_python(idx, ev.thread[idx], symbol_of, decoded, names.names)
    rows = np.flatnonzero(which & (start >= 0))
    for t in np.unique(on).tolist():
        mine = rows[thread[rows] == t]
        if not len(mine):
            continue
        changed = on == t
        pos = np.searchsorted(at[changed], start[mine], side="right") - 1
        module[mine] = np.where(pos >= 0, current[changed][np.maximum(pos, 0)], -1)


def _symbols(cap: Capture, names: Any, idx: np.ndarray) -> tuple[np.ndarray, list[tuple[bool, int, bool, bool]]]:
    """Each scope event as a symbol (-1: a PHASE event), and the symbols as
    (enter, name, backward, restored). Module names are registered in order of first
    appearance (names' ids are stable)."""
    ev = cap.events
    kinds = ev.kind[idx]
    scope = np.flatnonzero(kinds != EventKind.PHASE)
    uniq, inverse = factorize(ev.arg[idx[scope]])
    first = first_index(inverse, len(uniq))
    strings = cap.strings
    name_ids = np.zeros(len(uniq), np.int64)
    for u in np.argsort(first, kind="stable").tolist():
        a = int(uniq[u])
        name_ids[u] = names(strings[a] if a < len(strings) else "?")
    flags = ev.addr[idx[scope]]
    backward = (flags & MODULE_BACKWARD != 0).astype(np.int64)
    restored = (flags & MODULE_RESTORED != 0).astype(np.int64)
    code = ((name_ids[inverse] * 2 + restored) * 2 + backward) * 2 + (kinds[scope] == EventKind.MODULE_ENTER)
    symbols, sym = factorize(code)
    symbol_of = np.full(len(idx), -1, np.int64)
    symbol_of[scope] = sym
    return symbol_of, [(bool(c & 1), int(c >> 3), bool(c >> 1 & 1), bool(c >> 2 & 1)) for c in symbols.tolist()]


def walk_python(events: np.ndarray, threads: np.ndarray, symbol_of: np.ndarray,
                decoded: list[tuple[bool, int, bool, bool]], names: list[str]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each thread's innermost open scope changed: (event, thread,
    innermost name or -1), in event order. The reference for the C++ walk
    (csrc/analysis/scopes.cpp)."""
    n_sym = len(decoded)
    # Each thread's open scopes are a state, interned as an int; a training
    # loop repeats the same few, so each (state, symbol) transition is worked
    # out once and looked up after that.
    states: list[tuple[tuple[int, bool], ...]] = [()]
    state_id: dict[tuple[tuple[int, bool], ...], int] = {(): 0}
    moves: dict[int, int] = {}  # state * n_sym + symbol -> new state (-1: unchanged)

    def intern(scopes: tuple[tuple[int, bool], ...]) -> int:
        sid = state_id.get(scopes)
        if sid is None:
            sid = state_id[scopes] = len(states)
            states.append(scopes)
        return sid

    def move(state: int, symbol: int) -> int:
        enter, name, backward, restored = decoded[symbol]
        scopes = list(states[state])
        if enter:
            pos = len(scopes)
            if backward and not restored:  # a checkpoint's ENTER puts an open scope back as it was
                # A module's and its last child's backward begin at the same
                # node, child first: the parent goes under its open descendants.
                prefix = names[name] + "."
                while pos and scopes[pos - 1][1] and names[scopes[pos - 1][0]].startswith(prefix):
                    pos -= 1
            scopes.insert(pos, (name, backward))
        else:
            for j in range(len(scopes) - 1, -1, -1):
                if scopes[j] == (name, backward):
                    del scopes[j]
                    break
            else:
                return -1
        return intern(tuple(scopes))

    open_by_thread: dict[int, int] = {}  # thread -> state
    at: list[int] = []  # where a thread's scopes changed: event index, thread, new state
    on: list[int] = []
    now: list[int] = []
    for i, t, s in zip(events.tolist(), threads.tolist(), symbol_of.tolist(), strict=True):
        if s < 0:
            # Backward scopes whose inputs needed no gradient never close: a
            # phase change closes them all.
            for th, state in open_by_thread.items():
                scopes = states[state]
                kept = tuple(x for x in scopes if not x[1])
                if len(kept) != len(scopes):
                    open_by_thread[th] = intern(kept)
                    at.append(i)
                    on.append(th)
                    now.append(open_by_thread[th])
            continue
        key = open_by_thread.get(t, 0) * n_sym + s
        nxt = moves.get(key)
        if nxt is None:
            nxt = moves[key] = move(key // n_sym, s)
        if nxt >= 0:
            open_by_thread[t] = nxt
            at.append(i)
            on.append(t)
            now.append(nxt)
    innermost = np.array([x[-1][0] if x else -1 for x in states], np.int64)
    return np.array(at, np.int64), np.array(on, np.int64), innermost[np.array(now, np.int64)]
