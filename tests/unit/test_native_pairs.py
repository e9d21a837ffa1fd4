"""Pairing frees with allocations in C++ (allocscope._analysis,
csrc/analysis/pairs.cpp) against the numpy versions it replaces (the reference):
lifetimes (each ALLOC's FREE, unmatched frees, double allocations) and
deferred_frees (frees that waited for another stream), on every fixture and
on generated event streams with repeated, unbalanced and interleaved
addresses and blocks still pending at the end."""

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
from allocscope.attribution.lifetimes import lifetimes
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
