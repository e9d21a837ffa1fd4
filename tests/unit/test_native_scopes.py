"""The module-scope walk in C++ (allocscope._analysis, csrc/analysis/scopes.cpp)
against the Python walk it follows (attribution/scopes.py, walk_python):
the same changes of each thread's innermost scope, on every fixture and on
generated sequences of nested, interleaved and unbalanced forward and
backward scopes on several threads, with phase changes between them."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import allocscope
from allocscope.capture.format import EventKind
from allocscope.common.native import analysis
from allocscope.attribution.scopes import Names
from allocscope.attribution.scopes import _MODULE_KINDS, _symbols, module_scopes, walk_python

pytestmark = [pytest.mark.torch_agnostic,
              pytest.mark.skipif(analysis() is None, reason="allocscope._analysis is not built")]

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
FIXTURES = sorted(glob.glob(os.path.join(DATA, "*.alsc")) + glob.glob(os.path.join(DATA, "*", "*.alsc")))
NAMES = ["Model", "Model.a", "Model.a.x", "Model.a.y", "Model.b", "Model.b.x", "Other"]


def both(events, threads, symbols, table, names):
    py = walk_python(np.asarray(events), np.asarray(threads), np.asarray(symbols, np.int64), table, names)
    cc = analysis().walk_scopes(np.asarray(events, np.int64), np.asarray(threads, np.int64),
                                np.asarray(symbols, np.int64), table, names)
    for a, b in zip(py, cc, strict=True):
        assert a.tolist() == b.tolist()
    return py


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.relpath(p, DATA) for p in FIXTURES])
def test_fixtures_walk_the_same_natively(path):
    cap = allocscope.load(path)
    ev = cap.events
    idx = np.flatnonzero(np.isin(ev.kind, [int(k) for k in _MODULE_KINDS]) | (ev.kind == EventKind.PHASE))
    names = Names()
    symbols, table = _symbols(cap, names, idx)
    both(idx, ev.thread[idx].astype(np.int64), symbols, table, names.names)
    # and through module_scopes, for every row
    rows = np.flatnonzero(np.isin(ev.kind, [int(EventKind.ALLOC)]))
    start, thread = rows.astype(np.int64), ev.thread[rows].astype(np.int64)
    out = {}
    for engine in ("python", "native"):
        module = np.full(len(rows), -1, np.int64)
        module_scopes(cap, Names(), start, thread, module, np.ones(len(rows), bool), engine=engine)
        out[engine] = module.tolist()
    assert out["python"] == out["native"]


# (enter, name, backward, restored) symbols over hierarchical names, threads 0..2, phases (-1)
_event = st.one_of(st.tuples(st.integers(0, 2 * len(NAMES) * 4 - 1), st.integers(0, 2)),
                   st.tuples(st.just(-1), st.just(0)))


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=200))
def test_generated_scopes_walk_the_same_natively(seq):
    table = [(bool(c & 1), (c >> 3) % len(NAMES), bool(c >> 1 & 1), bool(c >> 2 & 1))
             for c in range(2 * len(NAMES) * 4)]
    events = list(range(len(seq)))
    both(events, [t for _, t in seq], [s for s, _ in seq], table, NAMES)
