"""Pairing each allocation with its free, and the bytes live over time."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..capture.format import EventKind
from ..capture.reader import Events
from ..common.native import analysis_for

__all__ = ["Lifetimes", "allocated_first", "lifetimes", "live_bytes"]


@dataclasses.dataclass(frozen=True)
class Lifetimes:
    """Allocation/free pairs of a capture, by event index.

    alloc: indices of ALLOC events; free: the index of each one's FREE, or -1
    if still live when recording stopped. unmatched_frees: FREE events of
    memory allocated before recording started. double_allocs: ALLOC events at
    an address that was already live (a free the recorder did not see).
    """

    alloc: np.ndarray
    free: np.ndarray
    unmatched_frees: np.ndarray
    double_allocs: np.ndarray

    @property
    def live_at_end(self) -> np.ndarray:
        return self.alloc[self.free < 0]


def lifetimes(events: Events, *, engine: str = "auto") -> Lifetimes:
    """Each ALLOC's FREE by address, in sequence order. engine: "native"
    (C++, allocscope._analysis: one pass with a hash map), "numpy" (the
    reference, by a sort) or "auto" (native where built and the events are in
    sequence order, as the reader gives them)."""
    fast = analysis_for(engine, "numpy")
    if fast is not None and (engine == "native" or events.in_sequence_order()):
        alloc, free, unmatched, doubles = fast.lifetimes(np.ascontiguousarray(events.kind, np.uint8),
                                                         np.ascontiguousarray(events.addr, np.uint64))
        return Lifetimes(alloc, free, unmatched, doubles)
    is_alloc = events.kind == EventKind.ALLOC
    is_free = events.kind == EventKind.FREE
    idx = np.flatnonzero(is_alloc | is_free)
    # Per address in sequence order, a well-formed stream alternates ALLOC,
    # FREE, ALLOC, ... (possibly starting with the FREE of an older block).
    # Addresses alone identify memory: CUDA's unified addressing keeps every
    # device's and the host's apart, and a wrapper FREE on CUDA does not know
    # its device (its ALLOC does).
    order = idx[np.lexsort((events.seq[idx], events.addr[idx]))]
    addr = events.addr[order]
    alloc_here = is_alloc[order]
    same_prev = np.zeros(len(order), bool)
    same_prev[1:] = addr[1:] == addr[:-1]
    prev_alloc = np.zeros(len(order), bool)
    prev_alloc[1:] = alloc_here[:-1]
    pair = same_prev & prev_alloc & ~alloc_here  # a FREE right after an ALLOC of its address
    free_of = np.full(len(order), -1, np.int64)
    free_of[np.flatnonzero(pair) - 1] = order[pair]
    allocs = order[alloc_here]
    frees = free_of[alloc_here]
    unmatched = order[~alloc_here & ~pair]
    doubles = order[alloc_here & same_prev & prev_alloc]
    sort = np.argsort(allocs, kind="stable")
    return Lifetimes(allocs[sort], frees[sort], np.sort(unmatched), np.sort(doubles))


def live_bytes(events: Events, lt: Lifetimes | None = None) -> np.ndarray:
    """Requested bytes live after each event, counting allocations made while
    recording (memory that existed before recording is not included)."""
    lt = lt if lt is not None else lifetimes(events)
    delta = np.zeros(len(events), np.int64)
    sizes = events.size[lt.alloc].astype(np.int64)
    delta[lt.alloc] += sizes
    freed = lt.free >= 0
    np.add.at(delta, lt.free[freed], -sizes[freed])
    return np.cumsum(delta)


def allocated_first(alloc_addr: np.ndarray, alloc_start: np.ndarray, unmatched_frees: dict[int, list[int]],
                    addresses: list[int]) -> set[int]:
    """Of these addresses (blocks a baseline holds), those whose first event
    is an ALLOC, not a FREE: an allocation another thread completed in the
    caching allocator just before the baseline's snapshot, sequenced just
    after it (docs/format.md, BASELINE), which the baseline already holds.
    alloc_addr/alloc_start: each recorded ALLOC's address and event, in
    event order; unmatched_frees: address -> FREEs of older memory."""
    if not addresses or not len(alloc_addr):
        return set()
    wanted = np.unique(np.asarray(addresses, np.uint64))
    pos = np.minimum(np.searchsorted(wanted, alloc_addr), len(wanted) - 1)
    hit = np.flatnonzero(wanted[pos] == alloc_addr)
    first: dict[int, int] = {}
    for a, e in zip(alloc_addr[hit].tolist(), alloc_start[hit].tolist(), strict=True):
        first.setdefault(int(a), int(e))  # in event order: the first ALLOC there
    return {a for a, e in first.items() if not unmatched_frees.get(a) or unmatched_frees[a][0] > e}
