"""allocscope's copy of ska::flat_hash_map's iteration order (the order in
which c10 releases freeable private pools) against c10's own map, compiled
into the test harness, on random insertions, erasures and erasing walks."""

import pytest

from allocscope.allocator.hashmap import FlatHashMap, mempool_hash

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

key = st.one_of(st.tuples(st.integers(1, 64), st.just(0)), st.tuples(st.just(0), st.integers(1, 64)),
                st.tuples(st.integers(1, 1 << 40), st.just(0)))
op = st.one_of(st.tuples(st.just(0), key).map(lambda t: (0, *t[1])),
               st.tuples(st.just(0), key).map(lambda t: (0, *t[1])),
               st.tuples(st.just(1), key).map(lambda t: (1, *t[1])),
               st.tuples(st.just(2), st.integers(1, 3), st.integers(0, 2)).map(lambda t: (2, t[1], t[2] % t[1])))


def model_walks(ops):
    m = FlatHashMap(mempool_hash)
    walks = []
    for kind, a, b in ops:
        if kind == 0:
            if (a, b) not in m:
                m[(a, b)] = 0
        elif kind == 1:
            if (a, b) in m:
                del m[(a, b)]
        else:
            walks.append([])
            for k, _ in m.visit():
                walks[-1].append(k)
                if mempool_hash(k) % a == b:
                    m.erase_current()
    walks.append(list(m))
    return walks


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(op, max_size=80))
def test_iteration_order_is_c10s(harness, ops):
    assert model_walks(ops) == [[tuple(k) for k in w] for w in harness.flat_hash_map_walks(ops)]


def test_a_map_behaves_as_a_dict():
    m = FlatHashMap(mempool_hash)
    for i in range(1, 40):
        m[(i, 0)] = i
    for i in range(1, 40, 3):
        del m[(i, 0)]
    assert sorted(m) == sorted((i, 0) for i in range(1, 40) if (i - 1) % 3)
    assert all(m[k] == k[0] for k in m) and len(m) == 26
    with pytest.raises(KeyError):
        m[(1, 0)]


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.integers(5, 40), st.data())
def test_a_rehashed_map_has_the_order_of_a_grown_one(harness, grown_to, data):
    """What the replay does when a recording shows that c10's map of
    freeable pools had grown before (private_pools.py): the survivors of a
    map that once held `grown_to` pools iterate in the order of a fresh map
    of them rehashed to that many buckets."""
    keys = list(range(1, grown_to + 1))  # graph pool ids: consecutive
    keep = data.draw(st.lists(st.sampled_from(keys), min_size=2, max_size=6, unique=True))
    ops = [(0, k, 0) for k in keys] + [(1, k, 0) for k in keys if k not in keep]
    (walk,) = harness.flat_hash_map_walks(ops)
    grown = FlatHashMap(mempool_hash)
    for k in keys:
        grown[(k, 0)] = 0
    fresh = FlatHashMap(mempool_hash)
    for k in keep:
        fresh[(k, 0)] = 0
    assert [tuple(k) for k in walk] == list(fresh.rehashed(grown.buckets))
