"""The iteration order of c10's ska::flat_hash_map, where the allocator's
behaviour depends on it: release_cached_blocks frees the freeable private
pools (graph_pools_freeable) in that map's order, and the order of its
SEGMENT_FREE events is what a replay must reproduce.

ska::flat_hash_map (c10/util/flat_hash_map.h) is a sherwood_v3 table:
Robin Hood open addressing with backward-shift deletion, Fibonacci hashing
onto a power-of-two number of slots, at most half full, plus max_lookups
overflow slots past the end. This class keeps the same slots for the same
insertions and erasures, so that iterating it visits keys in c10's order.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, Iterator, TypeVar

__all__ = ["FlatHashMap", "mempool_hash"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_FIBONACCI = 11400714819323198485
_MASK64 = (1 << 64) - 1
_MIN_LOOKUPS = 4


def mempool_hash(pool_id: tuple[int, int]) -> int:
    """c10::MempoolIdHash."""
    return pool_id[0] if pool_id[0] != 0 else pool_id[1]


class FlatHashMap(Generic[K, V]):
    """A dict whose iteration order is ska::flat_hash_map's."""

    def __init__(self, hash_fn: Callable[[K], int]):
        self._hash = hash_fn
        self._reset()

    def _reset(self, buckets: int = 0) -> None:
        self._buckets = buckets  # num_slots_minus_one + 1, or 0 for the empty default table
        self._lookups = max(_MIN_LOOKUPS, buckets.bit_length() - 1) if buckets else _MIN_LOOKUPS - 1
        self._shift = 64 - (buckets.bit_length() - 1) if buckets else 63
        # [key, value, distance from desired] or None; the last slot is the end marker.
        self._slots: list[list | None] = [None] * ((buckets or 1) + self._lookups - 1)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def buckets(self) -> int:
        """Slots (bucket_count()): the table grows and never shrinks, so its
        history, not only its keys, decides its order."""
        return self._buckets

    def _index(self, key: K) -> int:
        return ((_FIBONACCI * self._hash(key)) & _MASK64) >> self._shift

    def _find(self, key: K) -> int:
        if not self._buckets:
            return -1
        i, d = self._index(key), 0
        while i < len(self._slots) and self._slots[i] is not None and self._slots[i][2] >= d:
            if self._slots[i][0] == key:
                return i
            i, d = i + 1, d + 1
        return -1

    def __contains__(self, key: K) -> bool:
        return self._find(key) >= 0

    def __getitem__(self, key: K) -> V:
        i = self._find(key)
        if i < 0:
            raise KeyError(key)
        return self._slots[i][1]  # type: ignore[index]

    def __setitem__(self, key: K, value: V) -> None:
        i = self._find(key)
        if i >= 0:
            self._slots[i][1] = value  # type: ignore[index]
        else:
            self._emplace([key, value, 0])

    def _emplace(self, entry: list) -> None:
        slots = self._slots
        i, d = (self._index(entry[0]), 0) if self._buckets else (0, 0)
        while self._buckets and i < len(slots) and slots[i] is not None and slots[i][2] >= d:
            i, d = i + 1, d + 1
        if not self._buckets or d == self._lookups or self._count + 1 > self._buckets * 0.5:
            self._grow()
            self._emplace(entry)
            return
        entry[2] = d
        if slots[i] is None:
            slots[i] = entry
            self._count += 1
            return
        # Robin Hood: the entry takes this slot; the one it displaces moves on.
        result = i
        slots[i], entry = entry, slots[i]
        d = entry[2] + 1
        i += 1
        while True:
            if i >= len(slots) or slots[i] is None:
                entry[2] = d
                if i >= len(slots):
                    break
                slots[i] = entry
                self._count += 1
                return
            if slots[i][2] < d:
                entry[2] = d
                slots[i], entry = entry, slots[i]
                d = entry[2] + 1
            else:
                d += 1
                if d == self._lookups:
                    # c10 swaps the values only: the first-placed entry goes
                    # back out and is emplaced again after growing.
                    r = slots[result]
                    assert r is not None
                    r[0], r[1], entry[0], entry[1] = entry[0], entry[1], r[0], r[1]
                    break
            i += 1
        self._grow()
        self._emplace(entry)

    def _grow(self) -> None:
        buckets = max(4, 2 * self._buckets, 2 * self._count)  # rehash: at least count / max_load_factor
        buckets = 1 << (buckets - 1).bit_length()
        old = [e for e in self._slots if e is not None]
        self._reset(buckets)
        for e in old:
            self._emplace(e)

    def rehashed(self, buckets: int) -> "FlatHashMap[K, V]":
        """A copy with `buckets` slots (a power of two, at least twice the
        entries), its entries emplaced in this map's order as c10's rehash
        does: the map a longer history would have left."""
        out: FlatHashMap[K, V] = FlatHashMap(self._hash)
        out._reset(buckets)
        for e in self._slots:
            if e is not None:
                out._emplace([e[0], e[1], 0])
        return out

    def __delitem__(self, key: K) -> None:
        i = self._find(key)
        if i < 0:
            raise KeyError(key)
        self._erase_at(i)

    def _erase_at(self, i: int) -> None:
        slots = self._slots
        slots[i] = None
        self._count -= 1
        # Backward shift: the entries after it that are not at their desired slot move back one.
        while i + 1 < len(slots) and slots[i + 1] is not None and slots[i + 1][2] > 0:
            slots[i], slots[i + 1] = slots[i + 1], None
            slots[i][2] -= 1  # type: ignore[index]
            i += 1

    def __iter__(self) -> Iterator[K]:
        return iter([e[0] for e in self._slots if e is not None])

    def visit(self) -> Iterator[tuple[K, V]]:
        """Walks the map in slot order as c10's `for (it = begin(); it != end();)`
        loops do, allowing erase_current() of the entry just visited (the
        entry shifted into its slot is visited next, as after c10's
        `it = map.erase(it)`)."""
        self._pos = 0
        while self._pos < len(self._slots):
            e = self._slots[self._pos]
            if e is None:
                self._pos += 1
                continue
            self._erased = False
            yield e[0], e[1]
            if not self._erased:
                self._pos += 1

    def erase_current(self) -> None:
        self._erase_at(self._pos)
        self._erased = True
