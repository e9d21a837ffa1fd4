"""The module scope open on the allocating thread when each allocation was
made: MODULE_ENTER/EXIT events replayed per thread (backward scopes too, which
a phase change closes), for the rows no tensor label names a module for
(categories.py, rule 4)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._format import EventKind
from ..reader import Capture

__all__ = ["module_scopes"]

_MODULE_KINDS = (EventKind.MODULE_ENTER, EventKind.MODULE_EXIT)
_BACKWARD_FLAG = 1


def module_scopes(cap: Capture, names: Any, start: np.ndarray, thread: np.ndarray, module: np.ndarray,
                  which: np.ndarray) -> None:
    """Fills module[r] for rows `which` with the innermost module scope open
    on their thread when they were allocated."""
    ev = cap.events
    idx = np.flatnonzero(np.isin(ev.kind, [int(k) for k in _MODULE_KINDS]) | (ev.kind == EventKind.PHASE))
    if not len(idx):
        return
    # Each thread's open scopes are a state, interned as an int; a training
    # loop repeats the same few, so each (state, event) transition is worked
    # out once and looked up after that.
    states: list[tuple[tuple[int, bool], ...]] = [()]
    state_id: dict[tuple[tuple[int, bool], ...], int] = {(): 0}
    moves: dict[tuple[int, int, int, bool], tuple[int, bool]] = {}  # -> (new state, changed)
    open_by_thread: dict[int, int] = {}  # thread -> state
    at: list[int] = []  # where a thread's scopes changed: event index, thread, new state
    on: list[int] = []
    now: list[int] = []
    strings = cap.strings
    name_of: dict[int, int] = {}

    def intern(scopes: tuple[tuple[int, bool], ...]) -> int:
        sid = state_id.get(scopes)
        if sid is None:
            sid = state_id[scopes] = len(states)
            states.append(scopes)
        return sid

    def move(state: int, k: int, name: int, backward: bool) -> tuple[int, bool]:
        scopes = list(states[state])
        if k == EventKind.MODULE_ENTER:
            pos = len(scopes)
            if backward:
                # A module's and its last child's backward begin at the same
                # node, child first: the parent goes under its open descendants.
                prefix = names.names[name] + "."
                while pos and scopes[pos - 1][1] and names.names[scopes[pos - 1][0]].startswith(prefix):
                    pos -= 1
            scopes.insert(pos, (name, backward))
        else:
            for j in range(len(scopes) - 1, -1, -1):
                if scopes[j] == (name, backward):
                    del scopes[j]
                    break
            else:
                return state, False
        return intern(tuple(scopes)), True

    kinds = ev.kind[idx].tolist()
    threads = ev.thread[idx].tolist()
    flags = ev.addr[idx].tolist()
    args = ev.arg[idx].tolist()
    for i, k, t, f, a in zip(idx.tolist(), kinds, threads, flags, args, strict=True):
        if k == EventKind.PHASE:
            # Backward scopes whose inputs needed no gradient never close: a
            # phase change closes them all.
            for th, state in open_by_thread.items():
                scopes = states[state]
                kept = tuple(s for s in scopes if not s[1])
                if len(kept) != len(scopes):
                    open_by_thread[th] = intern(kept)
                    at.append(i)
                    on.append(th)
                    now.append(open_by_thread[th])
            continue
        name = name_of.get(a)
        if name is None:
            name = name_of[a] = names(strings[a] if a < len(strings) else "?")
        backward = bool(f & _BACKWARD_FLAG)
        state = open_by_thread.setdefault(t, 0)
        key = (state, k, name, backward)
        hit = moves.get(key)
        if hit is None:
            hit = moves[key] = move(state, k, name, backward)
        if hit[1]:
            open_by_thread[t] = hit[0]
            at.append(i)
            on.append(t)
            now.append(hit[0])
    innermost = np.array([s[-1][0] if s else -1 for s in states], np.int64)
    at_, on_, current = np.array(at, np.int64), np.array(on, np.int64), innermost[np.array(now, np.int64)]
    rows = np.flatnonzero(which & (start >= 0))
    for t in np.unique(on_).tolist():
        mine = rows[thread[rows] == t]
        if not len(mine):
            continue
        changed = on_ == t
        pos = np.searchsorted(at_[changed], start[mine], side="right") - 1
        module[mine] = np.where(pos >= 0, current[changed][np.maximum(pos, 0)], -1)
