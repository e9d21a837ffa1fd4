"""Memory against a searched value (reports/scaling.py) on made-up card
results: the parts of each run sum to its memory, lines through them, where
they bend, and where the allocator's size classes are crossed."""

import pytest

from allocscope.allocator.sizes import MiB
from allocscope.reports.scaling import memory_model, model_lines

pytestmark = pytest.mark.torch_agnostic


def card(value, *, params=100 * MiB, per_sample=2 * MiB, cached=0, largest=None, verdict="fits", split=None):
    activation = per_sample * value
    allocated = 3 * params + activation
    out = {"verdict": verdict, "peak_allocated_bytes": allocated, "peak_reserved_bytes": allocated + cached,
           "outside_allocator_bytes": 512 * MiB,
           "peak": {"by_category": {"parameter": params, "gradient": params, "optimizer_state": params,
                                    "activation": activation}},
           "largest_growing_request_bytes": largest(value) if largest else per_sample * value}
    if split is not None:
        out["max_split_size"] = split
    return out


def test_a_proportional_workload_is_a_fixed_and_a_per_unit_part():
    m = memory_model("B", [(v, card(v)) for v in (4, 16, 64)], 1, 128)
    assert m["linear"] and m["values"] == [4, 16, 64] and m["residual_bytes"] == 0
    assert m["fixed_bytes"] == 300 * MiB + 512 * MiB and m["per_unit_bytes"] == pytest.approx(2 * MiB)
    parts = m["parts"]
    assert parts["parameter"]["fixed_bytes"] == 100 * MiB
    assert parts["parameter"]["per_unit_bytes"] == pytest.approx(0, abs=1e-3)
    assert parts["activation"]["fixed_bytes"] == 0 and parts["activation"]["per_unit_bytes"] == pytest.approx(2 * MiB)
    assert parts["outside_allocator"]["fixed_bytes"] == 512 * MiB
    assert all(sum(p["at_values"][i] for p in parts.values()) == m["measured_bytes"][i] for i in range(3))
    text = "\n".join(model_lines(m))
    assert "812.00 MiB + 2.00 MiB per B (proportional" in text
    assert "per B: activation 2.00 MiB" in text and "optimizer state 100.00 MiB" in text


def test_where_the_line_bends_it_says_so_and_in_which_part():
    # a whole 20 MiB segment cached from 16 on: not proportional, and the cached part is why
    runs = [(v, card(v, cached=0 if v < 16 else 20 * MiB)) for v in (4, 8, 16, 64)]
    m = memory_model("B", runs, 1, 128)
    assert not m["linear"] and m["residual_bytes"] > 2 * MiB
    assert max(m["parts"], key=lambda k: m["parts"][k]["residual_bytes"]) == "cached_and_fragmented"
    text = "\n".join(model_lines(m))
    assert "NOT proportional" in text and "where the line bends: cached and fragmented" in text


def test_fewer_than_two_runs_that_fit_give_no_line():
    m = memory_model("B", [(8, card(8)), (9, card(9, verdict="out of memory")), (10, card(10, verdict="failed"))],
                     1, 128)
    assert m["fixed_bytes"] is None and m["values"] == [8] and "needs two values that fit" in m["why"]
    assert "needs two values that fit: 1 fit" in model_lines(m)[0]
    # two runs: an exact line, and it says that two cannot tell a bend
    m = memory_model("B", [(8, card(8)), (32, card(32))], 1, 128)
    assert not m["linear"] and "exact through two runs" in "\n".join(model_lines(m))


def test_the_allocator_s_size_classes_are_placed_between_runs_or_on_an_exact_line():
    # bracketed: 0.5 MiB at 1, 3 MiB at 6: on the line through them 2 asks for 1 MiB exactly (small pool), 3 more
    sizes = {1: MiB // 2, 6: 3 * MiB, 60: 12 * MiB + 7}
    m = memory_model("B", [(v, card(v, largest=sizes.get)) for v in sizes], 1, 100)
    by_size = {c["request_bytes"]: c for c in m["changes"]}
    assert by_size[MiB + 1]["value"] == 3 and by_size[MiB + 1]["between"] == [1, 6]
    assert by_size[10 * MiB]["between"] == [6, 60] and 6 < by_size[10 * MiB]["value"] <= 60
    # exactly proportional (4 KiB a sample): followed beyond the runs, within the range searched
    m = memory_model("B", [(v, card(v, largest=lambda v: 4096 * v)) for v in (4096, 8192)], 1, 8192)
    assert [(c["value"], c["between"]) for c in m["changes"]] == [(257, None), (2560, None)]
    m = memory_model("B", [(v, card(v, largest=lambda v: 4096 * v)) for v in (4096, 8192)], 1000, 8192)
    assert [c["value"] for c in m["changes"]] == [2560]  # 257 is outside the range searched
    # max_split_size, where set, is a class too
    m = memory_model("B", [(v, card(v, largest=lambda v: 4096 * v, split=64 * MiB)) for v in (4096, 8192)],
                     1, 1 << 20)
    assert [c["value"] for c in m["changes"]] == [257, 2560, 16385]
    assert "max_split_size (64.00 MiB)" in m["changes"][-1]["what"]
