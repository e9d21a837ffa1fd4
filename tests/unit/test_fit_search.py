"""fit --search (harness.search.search_largest) on made-up verdicts and
memory curves: the largest value that fits, in at most one run more than
bisection (3 to 5 where memory is linear), and the stop where a run fails for
another reason."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocscope.harness.search import SearchFailed, search_largest

pytestmark = pytest.mark.torch_agnostic


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


def memory(need, budget, calls, lower_bound=1):
    """Runs whose memory is need(v): the headroom where it fits, and where it
    runs out a shortfall that is at most the deficit (as the post-mortem's:
    what the failing request lacked), here deficit // lower_bound."""
    def run(v):
        calls.append(v)
        n = need(v)
        if n <= budget:
            return {"verdict": "fits", "exit_status": 0, "headroom_bytes": budget - n}
        return {"verdict": "out of memory", "exit_status": 1, "shortfall_bytes": max(1, (n - budget) // lower_bound)}
    return run


@given(base=st.integers(0, 10**9), per=st.integers(1, 10**7), budget=st.integers(0, 2 * 10**10),
       low=st.integers(1, 64), span=st.integers(0, 4096))
def test_memory_that_grows_linearly_takes_a_few_runs(base, per, budget, low, span):
    calls, high = [], low + span
    out = search_largest(low, high, memory(lambda v: base + per * v, budget, calls))
    threshold = (budget - base) // per if budget >= base else low - 1
    expected = None if threshold < low else min(threshold, high)
    assert out["largest"] == expected and out["runs"] == len(calls) == len(set(calls))
    assert out["runs"] <= 5  # two bisections, then the boundary and its neighbour


@given(threshold_at=st.floats(0, 1), shape=st.sampled_from(["square", "steps", "sqrt"]),
       lower_bound=st.integers(1, 8), span=st.integers(0, 4096))
def test_any_monotone_memory_takes_at_most_one_run_more_than_bisection(threshold_at, shape, lower_bound, span):
    calls, low, high = [], 1, 1 + span
    need = {"square": lambda v: v * v, "steps": lambda v: (v // 100) * 10**6 + v, "sqrt": lambda v: int(1000 * v ** 0.5)}[shape]
    budget = need(low + int(threshold_at * span))
    out = search_largest(low, high, memory(need, budget, calls, lower_bound))
    expected = max(v for v in range(low, high + 1) if need(v) <= budget)
    assert out["largest"] == expected and len(calls) == len(set(calls))
    assert out["runs"] <= math.ceil(math.log2(span + 2)) + 1


def test_replays_narrow_the_range_and_runs_confirm_the_answer():
    calls = []
    known = {v: {"verdict": "fits" if v <= 37 else "out of memory"} for v in (10, 30, 40, 500)}
    out = search_largest(1, 1024, verdicts(37, calls), known)
    assert out["largest"] == 37 and out["confirmed"]
    assert all(30 < v <= 40 for v in calls)  # only inside what the replays left open
    assert out["runs"] <= 4 and out["replayed"] == [10, 30, 40, 500]
    assert out["at_largest"]["verdict"] == "fits" and out["at_next"]["verdict"] == "out of memory"


@given(threshold=st.integers(-5, 110), wrong=st.integers(-5, 110))
def test_replays_a_run_contradicts_are_dropped(threshold, wrong):
    # replays with another boundary (the program depends on the card's memory): the runs decide
    calls = []
    known = {v: {"verdict": "fits" if v <= wrong else "out of memory"} for v in range(1, 101, 7)}
    out = search_largest(1, 100, verdicts(threshold, calls), known)
    expected = None if threshold < 1 else min(threshold, 100)
    assert out["largest"] == expected and len(calls) == len(set(calls))
    assert out["runs"] <= 2 + 2 * math.ceil(math.log2(102))


@given(span=st.integers(0, 10**7), boundary_at=st.floats(0, 1), curve=st.lists(st.integers(0, 10**6), min_size=1,
       max_size=40), lower_bound=st.integers(1, 8), base=st.integers(0, 10**9))
def test_generated_memory_curves_never_take_more_than_bisection_and_one(span, boundary_at, curve, lower_bound, base):
    """Monotone curves made of generated steps and slopes (flat stretches,
    jumps, a boundary anywhere, most probes running out where it is near the
    bottom): the answer is exact, in at most ceil(log2(width)) + 1 runs."""
    low, high = 1, 1 + span
    pieces = len(curve)

    def need(v):  # piecewise linear through the generated increments, nondecreasing
        x = (v - low) * pieces / (span + 1)
        i = min(int(x), pieces - 1)
        return base + sum(curve[:i]) + int(curve[i] * (x - i)) + v

    budget = need(low + int(boundary_at * span))
    calls = []
    out = search_largest(low, high, memory(need, budget, calls, lower_bound))
    assert out["largest"] is not None and need(out["largest"]) <= budget
    assert out["largest"] == high or need(out["largest"] + 1) > budget
    assert len(calls) == len(set(calls)) and out["runs"] <= math.ceil(math.log2(span + 2)) + 1


def test_the_issue_s_linear_workload_takes_no_more_than_bisection_and_one():
    """`fit --search BATCH=1..4000000` on a two-layer MLP that keeps its input
    (issue 30): interpolation crept from both sides near the boundary (35
    runs, bisection 22). Memory: a fixed part, a part per sample, and the
    caching allocator's rounding (2 MiB segments for the large blocks)."""
    def need(v):
        per_sample = 4 * (1024 + 4096 + 4096 + 10)
        return (300 << 20) + -(-(v * per_sample) // (2 << 20)) * (2 << 20)
    for budget in (15 << 30, 16 << 30, (15 << 30) + 12345):
        calls = []
        out = search_largest(1, 4_000_000, memory(need, budget, calls))
        assert need(out["largest"]) <= budget < need(out["largest"] + 1)
        assert out["runs"] <= 23, calls
