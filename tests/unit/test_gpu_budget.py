"""The gpu_memory marker's arguments and limits (the plugin's runs are in
tests/integration/test_gpu_memory_plugin.py)."""

from __future__ import annotations

import pytest

from allocscope.harness.budget import Budget, BudgetError, budget_of

pytestmark = pytest.mark.torch_agnostic


def test_budget_of_reads_sizes_and_the_gpu():
    b = budget_of(("A100-40GB",), {"max_reserved": "30GiB", "max_allocated": 1000, "memory": "24GB"}, None)
    assert b == Budget("A100-40GB", memory=24 * 10**9, max_reserved=30 << 30, max_allocated=1000)
    assert budget_of((), {"max_reserved": "1GiB"}, "L4-24GB").gpu == "L4-24GB"  # the session's card
    assert budget_of((), {"gpu": "t4-16gb", "max_reserved": "1GiB"}, "L4-24GB").gpu == "t4-16gb"
    routed = budget_of(("H100-80GB",), {"max_reserved": "1GiB", "routing": "balanced:1.50", "compute": "all"}, None)
    assert (routed.routing, routed.compute) == ("balanced:1.5", "all")


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {"max_reserved": "1GiB"}, "needs gpu="),
    (("A100-40GB",), {}, "needs max_reserved"),
    (("A100-40GB",), {"max_reserved": "12 parsecs"}, "max_reserved: not a size"),
    (("A100-40GB",), {"max_allocated": 0}, "not a positive size"),
    (("A100-40GB",), {"max_reserved": True}, "max_reserved: not a size"),
    (("A100-40GB",), {"max_reserverd": "1GiB"}, "unknown argument 'max_reserverd'"),
    (("A100-40GB", "L4-24GB"), {"max_reserved": "1GiB"}, "one positional argument"),
    (("A100-40GB",), {"gpu": "L4-24GB", "max_reserved": "1GiB"}, "one positional argument"),
    (("B200-192GB",), {"max_reserved": "1GiB"}, "unknown GPU 'B200-192GB'"),
    (("2xA100-40GB",), {"max_reserved": "1GiB"}, "one device"),
    (("A100-40GB",), {"max_reserved": "1GiB", "routing": "random"}, "routing 'random'"),
    (("A100-40GB",), {"max_reserved": "1GiB", "compute": "most"}, "compute 'most'"),
])
def test_budget_of_refuses(args, kwargs, message):
    with pytest.raises(BudgetError, match=message.replace("(", r"\(")):
        budget_of(args, kwargs, None)


def test_excess_at_the_limit():
    b = Budget("A100-40GB", max_reserved=1000, max_allocated=500)
    assert b.excess(1000, 500) == []  # at the limit is within it
    assert [s.split()[1] for s in b.excess(1001, 501)] == ["reserved", "allocated"]
    assert Budget("A100-40GB", max_allocated=10).excess(10**12, 10) == []  # no reserved limit
