"""fit --search's bisection (reports.fit.search_largest) on made-up
verdicts: the largest value that fits, in about log2 of the range runs,
and the stop where a run fails for another reason."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocscope.reports.fit import SearchFailed, search_largest


def verdicts(threshold, calls):
    def run(v):
        calls.append(v)
        return {"verdict": "fits" if v <= threshold else "out of memory", "exit_status": 0 if v <= threshold else 1}
    return run


@given(low=st.integers(-50, 50), span=st.integers(0, 2000), offset=st.integers(-3, 2003))
def test_the_largest_value_that_fits_in_log_runs(low, span, offset):
    high, threshold, calls = low + span, low + offset, []
    out = search_largest(low, high, verdicts(threshold, calls))
    expected = None if threshold < low else min(threshold, high)
    assert out["largest"] == expected
    assert out["runs"] == len(calls) == len(set(calls)) <= math.ceil(math.log2(span + 2))
    assert out["tried"] == calls
    if expected is not None:
        assert out["at_largest"]["verdict"] == "fits"
    if expected is None or expected < high:
        assert out["at_next"]["verdict"] == "out of memory"
    else:
        assert out["at_next"] is None  # everything fits: nothing above was tried


def test_a_run_that_fails_otherwise_stops_the_search():
    def run(v):
        return {"verdict": "failed", "exit_status": 3, "capture": "c.alsc"} if v > 5 else {"verdict": "fits"}
    with pytest.raises(SearchFailed, match=r"failed \(exit status 3\) without running out of memory.*c.alsc"):
        search_largest(1, 100, run)
