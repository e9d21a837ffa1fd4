"""Test helpers: totals implied by a CUDA capture's baselines and events."""

from allocscope import EventKind
from allocscope.allocator.segments import baseline_blocks as _baseline_blocks


def baseline_blocks(baseline):
    """{address: (size, requested)} of allocated blocks in a CUDA baseline."""
    return {a: (size, req) for a, (size, req, _dev) in _baseline_blocks(baseline).items()}


def replay_totals(cap, upto=None):
    """(requested bytes live, reserved bytes) after the first `upto` events
    (all by default), from the start baseline and the events."""
    live = {a: r for a, (_, r) in baseline_blocks(cap.baseline("start")).items()}
    reserved = sum(s["total_size"] for s in cap.baseline("start")["segments"])
    ev = cap.events
    for i in range(len(ev) if upto is None else upto):
        kind, addr, size = int(ev.kind[i]), int(ev.addr[i]), int(ev.size[i])
        if kind == EventKind.ALLOC:
            live[addr] = size
        elif kind == EventKind.FREE:
            live.pop(addr)
        elif kind in (EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_MAP):
            reserved += size
        elif kind in (EventKind.SEGMENT_FREE, EventKind.SEGMENT_UNMAP):
            reserved -= size
    return sum(live.values()), reserved


def check_start_to_end(cap):
    """Asserts that a CUDA capture's events carry its start baseline exactly to
    its end baseline: live requested bytes, reserved bytes and live blocks."""
    import numpy as np

    from allocscope.attribution.lifetimes import lifetimes

    start, end = cap.baseline("start"), cap.baseline("end")
    upto = int(np.flatnonzero(cap.events.kind == EventKind.SNAPSHOT)[-1])  # where the end baseline was taken
    end_blocks = baseline_blocks(end)
    assert replay_totals(cap, upto) == (sum(r for _, r in end_blocks.values()),
                                        sum(s["total_size"] for s in end["segments"]))
    lt = lifetimes(cap.events.select(np.arange(upto)))
    ev = cap.events
    freed_older = set(ev.addr[lt.unmatched_frees].tolist())
    assert len(lt.double_allocs) == 0
    assert freed_older <= set(baseline_blocks(start))
    live = {int(ev.addr[i]) for i in lt.live_at_end} | (set(baseline_blocks(start)) - freed_older)
    assert live == set(end_blocks)


def assert_exact(cap):
    """Replays a CUDA capture and asserts the replay followed the recording
    exactly (every segment event, every address, the end snapshot); returns
    the replay."""
    from allocscope.allocator.replay import replay

    rep = replay(cap)
    f = rep.fidelity
    assert f.first_mismatch is None, f.first_mismatch
    assert f.matched == f.recorded_segment_events > 0
    assert f.address_mismatches == 0
    assert f.end_snapshot["equal"], f.end_snapshot
    return rep
