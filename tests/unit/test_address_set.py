"""The saved-tensor labeler's set of storages labelled in a forward
(csrc/recorder/address_set.h: open addressing, emptied by a generation)
against Python's set, on random inserts and clears, past its growth."""

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

# Addresses from a few storages (repeats), aligned as the allocator's, and clears (0).
address = st.one_of(st.integers(1, 40).map(lambda i: i * 512), st.integers(1, 1 << 47))
op = st.one_of(address, address, address, st.just(0))


def model(ops):
    seen, added = set(), []
    for a in ops:
        if a == 0:
            seen.clear()
        else:
            added.append(a not in seen)
            seen.add(a)
    return added


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(op, max_size=600))
def test_inserts_answer_as_a_set(harness, ops):
    assert harness.address_set_inserts(ops) == model(ops)


def test_a_forward_of_thousands_of_storages_grows_and_a_clear_forgets_them(harness):
    first = [i * 4096 for i in range(1, 3001)]
    ops = first + first[::7] + [0] + first[::3] + first[::3]
    assert harness.address_set_inserts(ops) == model(ops)
