"""Pairing frees with allocations in C++ (allocscope._analysis,
csrc/analysis/pairs.cpp) against the numpy versions it replaces (the reference):
lifetimes (each ALLOC's FREE, unmatched frees, double allocations),
deferred_frees (frees that waited for another stream) and the rows tensor
labels name (attribution's join_labels) and the labels that decide a row's
meaning (label_winners), on every fixture and on generated
event streams with repeated, unbalanced and interleaved addresses, memory
from before recording, and blocks still pending at the end."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import allocscope
from allocscope.capture.format import EventKind as K
from allocscope.common.native import analysis
from allocscope.allocator.recorded import deferred_frees
from allocscope.allocator.segments import baseline_blocks
from allocscope.attribution.categories import _label_winners
from allocscope.attribution.rows import Rows, join_labels
from allocscope.attribution.lifetimes import lifetimes
from allocscope.capture.format import TENSOR_LABELS
from allocscope.capture.reader import Events

pytestmark = [pytest.mark.torch_agnostic,
              pytest.mark.skipif(analysis() is None, reason="allocscope._analysis is not built")]

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
FIXTURES = sorted(glob.glob(os.path.join(DATA, "*.alsc")) + glob.glob(os.path.join(DATA, "*", "*.alsc")))


def same_lifetimes(events):
    a, b = lifetimes(events, engine="numpy"), lifetimes(events, engine="native")
    for f in ("alloc", "free", "unmatched_frees", "double_allocs"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f


class _Capture:
    """What deferred_frees reads of a capture."""

    def __init__(self, events, pending):
        self.events = events
        self._end = {"label": "end", "segments": [
            {"device": 0, "address": a, "total_size": 512, "stream": 0, "is_large": False,
             "is_expandable": False, "blocks": [[512, 512, False, True]]} for a in pending]}

    def baseline(self, label):
        return self._end if label == "end" else None


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.relpath(p, DATA) for p in FIXTURES])
def test_fixtures_pair_the_same_natively(path):
    cap = allocscope.load(path)
    same_lifetimes(cap.events)
    assert deferred_frees(cap, engine="numpy").tolist() == deferred_frees(cap, engine="native").tolist()


_KINDS = [K.ALLOC, K.ALLOC, K.FREE, K.FREE, K.FREE_COMPLETED, K.MARK]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(0, 6)), max_size=150),
       st.sets(st.integers(0, 6), max_size=3))
def test_generated_streams_pair_the_same_natively(stream, pending):
    base = 0x7F0000000000
    events = Events(kind=np.array([int(k) for k, _ in stream], np.uint8),
                    addr=np.array([base + 512 * a for _, a in stream], np.uint64),
                    seq=np.arange(len(stream), dtype=np.uint64))
    same_lifetimes(events)
    cap = _Capture(events, [base + 512 * a for a in pending])
    assert deferred_frees(cap, engine="numpy").tolist() == deferred_frees(cap, engine="native").tolist()


def test_events_out_of_sequence_order_take_the_sort():
    # a hand-made capture whose sequence numbers go back: "auto" must not walk it in index order
    events = Events(kind=np.array([K.FREE, K.ALLOC], np.uint8), addr=np.array([512, 512], np.uint64),
                    seq=np.array([5, 1], np.uint64))
    assert not events.in_sequence_order()
    lt = lifetimes(events)
    assert lt.alloc.tolist() == [1] and lt.free.tolist() == [0]


def test_an_unknown_engine_is_refused():
    events = Events(kind=np.array([K.ALLOC], np.uint8), addr=np.array([512], np.uint64), seq=np.array([0], np.uint64))
    with pytest.raises(ValueError, match="unknown engine"):
        lifetimes(events, engine="fast")


# ---- tensor labels joined to the rows live at their address (attribution/categories.py)

_LABELS = [int(k) for k in TENSOR_LABELS]


class _Events:
    """What Rows and join_labels read of a capture."""

    def __init__(self, events):
        self.events = events


def joined_labels(cap, older, engine):
    """(each label's row, the rows' addresses and ends, warnings) as attribute() makes them:
    the recorded rows, rows of older memory at `older` addresses, then the labels."""
    ev = cap.events
    rows = Rows(cap, len(ev), None)
    if older:
        rows.add_older(older, [512] * len(older), None, [rows.free_after(a, -1) for a in older], 0)
    label_idx = np.flatnonzero(np.isin(ev.kind, _LABELS))
    warnings = []
    label_rows = join_labels(ev, rows, label_idx, "cuda", warnings, engine=engine)
    return label_rows.tolist(), rows.column("addr").tolist(), rows.column("end").tolist(), warnings


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.relpath(p, DATA) for p in FIXTURES])
def test_fixtures_join_their_labels_the_same_natively(path):
    cap = allocscope.load(path)
    base = cap.baseline("start")
    older = sorted(baseline_blocks(base)) if base is not None and base.get("segments") is not None else []
    assert joined_labels(cap, older, "numpy") == joined_labels(cap, older, "native")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_KINDS + [K.PARAMETER, K.GRADIENT, K.ACTIVATION] * 2), st.integers(0, 6)),
                max_size=150),
       st.sets(st.integers(0, 6), max_size=3))
def test_generated_streams_join_their_labels_the_same_natively(stream, older):
    base = 0x7F0000000000
    n = len(stream)
    events = Events(kind=np.array([int(k) for k, _ in stream], np.uint8),
                    addr=np.array([base + 512 * a for _, a in stream], np.uint64),
                    size=np.full(n, 512, np.uint64), seq=np.arange(n, dtype=np.uint64),
                    **{c: np.zeros(n, np.int64) for c in ("block", "stack", "op", "thread", "device")})
    cap = _Events(events)
    addrs = sorted(base + 512 * a for a in older)
    assert joined_labels(cap, addrs, "numpy") == joined_labels(cap, addrs, "native")


def label_winners(row, priority, engine):
    winners, last = _label_winners(np.array(row, np.int64), np.array(priority, np.int64), engine)
    return winners.tolist(), last.tolist()


def test_a_label_wins_its_row_until_one_of_higher_priority_comes():
    # rows 0 and 1 interleaved; lower priority wins, the first of equal priority stays
    row, priority = [0, 1, 0, 0, 1, 0], [3, 2, 3, 1, 2, 0]
    for engine in ("numpy", "native"):
        assert label_winners(row, priority, engine) == ([0, 1, 3, 5], [False, True, False, True])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, len(TENSOR_LABELS))), max_size=200))
def test_generated_labels_elect_the_same_winners_natively(labels):
    row, priority = [r for r, _ in labels], [p for _, p in labels]
    assert label_winners(row, priority, "numpy") == label_winners(row, priority, "native")
