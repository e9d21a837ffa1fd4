"""common/arrays.py's factorize and first_index against np.unique, the
reference they stand in for: values in a small range (the table), in a wide
one (np.unique itself), negative, unsigned, repeated, empty."""

import numpy as np
import pytest

from allocscope.common.arrays import factorize, first_index

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

pytestmark = pytest.mark.torch_agnostic

values = st.one_of(
    hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(0, 40)),          # ids: the table
    hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(-50, 50)),        # below zero
    hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(-(1 << 62), 1 << 62)),  # wide: np.unique
    hnp.arrays(np.uint64, st.integers(0, 300), elements=st.integers(0, 1 << 63)),
    hnp.arrays(np.uint64, st.integers(0, 300), elements=st.integers((1 << 64) - 100, (1 << 64) - 1)),
    hnp.arrays(np.uint8, st.integers(0, 300)),
    hnp.arrays(np.int8, st.integers(0, 300)),
)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(values)
def test_factorize_is_np_unique(v):
    uniq, codes = factorize(v)
    want_uniq, want_first, want_codes = np.unique(v, return_index=True, return_inverse=True)
    assert uniq.dtype == v.dtype
    assert uniq.tolist() == want_uniq.tolist()
    assert codes.tolist() == np.asarray(want_codes).reshape(-1).tolist()
    assert first_index(codes, len(uniq)).tolist() == want_first.tolist()


def test_first_index_of_a_code_that_does_not_occur_is_past_the_end():
    assert first_index(np.array([2, 0, 2], np.int64), 4).tolist() == [1, 3, 0, 3]


def test_a_wide_range_does_not_allocate_a_table_of_its_size():
    # 2^62 apart: a table indexed by value would not fit in memory.
    v = np.array([1 << 62, 0, 1 << 62, 5], np.int64)
    uniq, codes = factorize(v)
    assert uniq.tolist() == [0, 5, 1 << 62] and codes.tolist() == [2, 0, 2, 1]
