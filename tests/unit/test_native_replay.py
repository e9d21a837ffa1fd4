"""The replay in C++ (allocscope._analysis, allocator/native.py) against the
Python model it follows (allocator/model.py, the reference): the same
timelines, block sizes, OOMs, states, fidelity and counters, decision for
decision, on every CUDA fixture (real captures from an H100 and the virtual
GPU) and on generated request streams under every allocator setting the
native replay takes, faithful and predictive (other settings, a smaller
card), with states asked for at random events and replays stopped early.

The generated captures are written by running the Python model itself (as
tests/support/training_run.py does), so their faithful replay is exact and
the predictive ones diverge from them: both paths of the checker are taken.
"""

from __future__ import annotations

import glob
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import allocscope
from allocscope.capture.format import EventKind as K
from allocscope.allocator import native
from allocscope.allocator.blocks import BumpAddresses
from allocscope.allocator.config import AllocatorConfig, parse_alloc_conf
from allocscope.allocator.model import DeviceAllocator, free_block_order
from allocscope.allocator.replay import replay
from allocscope.allocator.state import segments
from allocscope.capture.writer import CaptureWriter

pytestmark = [pytest.mark.torch_agnostic,
              pytest.mark.skipif(not native.built(), reason="allocscope._analysis is not built")]

MiB, GiB = 1 << 20, 1 << 30
DATA = os.path.join(os.path.dirname(__file__), "..", "data")
_SEGMENT_KINDS = {"segment_alloc": K.SEGMENT_ALLOC, "segment_free": K.SEGMENT_FREE}
# Settings the captures are recorded with (the generator's model runs with them too).
RECORDED = ["", "max_split_size_mb:20", "roundup_power2_divisions:4",
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", "garbage_collection_threshold:0.6",
            "max_split_size_mb:20,max_non_split_rounding_mb:64", "large_segment_size_mb:32"]
# Settings the captures are replayed with besides their own (predictions).
OTHER = [AllocatorConfig(), AllocatorConfig(max_split_size=40 * MiB),
         AllocatorConfig(roundup_power2_divisions=(2,) * 16),
         AllocatorConfig(garbage_collection_threshold=0.5, per_process_memory_fraction=0.6),
         AllocatorConfig(large_segment_size=64 * MiB)]


def assert_same(path_or_cap, **kw):
    cap = allocscope.load(path_or_cap) if isinstance(path_or_cap, str) else path_or_cap
    ref = replay(cap, engine="python", **kw)
    got = replay(cap, engine="native", **kw)
    where = f"{cap.path} {kw}"
    for f in ("reserved", "allocated", "active", "largest_free", "block_sizes"):
        a, b = getattr(ref, f), getattr(got, f)
        if not np.array_equal(a, b):
            i = int(np.flatnonzero(a != b)[0]) if len(a) == len(b) else -1
            raise AssertionError(f"{where}: {f} differs first at {i}")
    for f in ("ooms", "avoided_ooms", "states", "fidelity", "warnings", "replayed_until", "faithful", "limit"):
        assert getattr(ref, f) == getattr(got, f), f"{where}: {f} differs"
    assert ref.stats() == got.stats(), where
    return ref


FIXTURES = sorted(glob.glob(os.path.join(DATA, "*cuda*.alsc")) + glob.glob(os.path.join(DATA, "*", "cuda*.alsc")))


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.relpath(p, DATA) for p in FIXTURES])
def test_fixtures_replay_the_same_natively(path):
    cap = allocscope.load(path)
    if native.unsupported(cap, replay(cap, engine="python").config, []) is not None:
        with pytest.raises(ValueError, match="cannot replay"):
            replay(cap, engine="native")
        return
    n = len(cap.events)
    assert_same(cap, states_at=[-1, 0, n // 3, n // 2, n - 1])
    assert_same(cap, limit=8 * GiB)
    assert_same(cap, config=parse_alloc_conf("max_split_size_mb:24"), stop_after=n // 2)


def test_auto_picks_the_native_replay_and_falls_back_for_expandable_segments():
    train = allocscope.load(os.path.join(DATA, "cuda_train_v1.alsc"))
    assert all(isinstance(d, native.DeviceCounters) for d in replay(train).devices.values())
    expandable = allocscope.load(os.path.join(DATA, "cuda_fragment_expandable_v1.alsc"))
    assert all(isinstance(d, DeviceAllocator) for d in replay(expandable).devices.values())
    with pytest.raises(ValueError, match="unknown replay engine"):
        replay(train, engine="fast")


# ---- generated request streams

_size = st.one_of(st.integers(1, 4096), st.integers(4096, 1 * MiB + 4096), st.integers(1 * MiB, 12 * MiB),
                  st.integers(12 * MiB, 100 * MiB), st.integers(12 * MiB, 100 * MiB), st.sampled_from([512, 1 * MiB, 2 * MiB, 10 * MiB, 20 * MiB]))
_op = st.one_of(
    st.tuples(st.just("alloc"), _size, st.integers(0, 3)),
    st.tuples(st.just("alloc"), _size, st.integers(0, 3)),
    st.tuples(st.just("alloc"), _size, st.sampled_from([0, 0, 1, 2])),
    st.tuples(st.just("free"), st.integers(0, 1000)),
    st.tuples(st.just("free_deferred"), st.integers(0, 1000)),
    st.tuples(st.just("complete"), st.integers(0, 1000)),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("fraction"), st.floats(0.3, 1.0)),
)
# (device, stream handle) of capture streams 0..3: three streams on device 0, one on device 1.
_STREAMS = [(0, 0), (0, 0x111), (0, 0x222), (1, 0)]


def write_program(path, program, conf, torch_version, total):
    cfg = parse_alloc_conf(conf)
    meta = {"torch": torch_version, "devices_recorded": ["cuda"],
            "cuda_devices": [{"index": d, "total_memory": total} for d in (0, 1)]}
    b = CaptureWriter(meta, device=0)
    streams = [b.stream(d, h) for d, h in _STREAMS]
    synthetic = BumpAddresses(0x7F0000000000)
    devs = [DeviceAllocator(cfg, device=d, total=total, capacity=total, addresses=synthetic,
                            segment_order=free_block_order(torch_version)) for d in (0, 1)]
    base = {"max_split_size": cfg.max_split_size, "garbage_collection_threshold": cfg.garbage_collection_threshold,
            "expandable_segments": False, "last_allocator_settings": conf,
            "roundup_power2_divisions": list(cfg.roundup_power2_divisions)}
    b.baseline({"label": "start", "device_type": "cuda", "seq": 0, "segments": [], "config": base,
                "devices": [{"index": d, "total": total, "free": total, "used": 0} for d in (0, 1)]})
    live, pending = [], []  # (stream, block, its address)
    for op in program:
        if op[0] == "alloc":
            _, size, s = op
            dev = devs[_STREAMS[s][0]]
            n = len(dev.events)
            blk = dev.malloc(size, _STREAMS[s][1])
            for e in dev.events[n:]:
                b.event(_SEGMENT_KINDS[e.kind], addr=e.addr, size=e.size, stream=streams[s])
            if blk is None:
                # arg: the device's free bytes, as c10 reports them (the replay bounds the card by them)
                b.event(K.OOM, size=size, block=size, arg=total - dev.reserved, stream=streams[s])
            else:
                live.append((s, blk, blk.addr))
                b.alloc(blk.addr, size, stream=streams[s])
        elif op[0] in ("free", "free_deferred") and live:
            s, blk, addr = live.pop(op[1] % len(live))
            deferred = op[0] == "free_deferred"
            devs[_STREAMS[s][0]].free(blk, deferred)  # (a merge may move blk.addr)
            b.free(addr, stream=streams[s])
            if deferred:
                pending.append((s, blk, addr))
        elif op[0] == "complete" and pending:
            s, blk, addr = pending.pop(op[1] % len(pending))
            if blk.pending:  # not already completed by a release
                devs[_STREAMS[s][0]].complete(blk)
            b.event(K.FREE_COMPLETED, addr=addr, stream=streams[s])
        elif op[0] == "empty_cache":
            for dev in devs:
                n = len(dev.events)
                dev.empty_cache()
                for e in dev.events[n:]:
                    b.event(_SEGMENT_KINDS[e.kind], addr=e.addr, size=e.size, stream=streams[0 if dev.device == 0 else 3])
            b.event(K.EMPTY_CACHE, stream=streams[0])
        elif op[0] == "fraction":
            devs[0].set_fraction(op[1])
            bits = struct.unpack("<Q", struct.pack("<d", op[1]))[0]
            b.event(K.SET_FRACTION, arg=int(op[1] * 1e9), block=bits, stream=streams[0])
    b.baseline({"label": "end", "device_type": "cuda", "seq": b.n_events, "config": base,
                "segments": [seg.to_baseline() for dev in devs for seg in segments(dev)],
                "devices": [{"index": d, "total": total, "free": total, "used": 0} for d in (0, 1)]})
    return b.write(path)


# A prefix of allocations fills the card, so that releases and OOMs happen.
_program = st.builds(lambda head, tail: head + tail,
                     st.lists(st.tuples(st.just("alloc"), _size, st.integers(0, 3)), min_size=0, max_size=12),
                     st.lists(_op, min_size=1, max_size=150))


@settings(max_examples=int(os.environ.get("ALLOCSCOPE_EXAMPLES", "200")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=_program, conf=st.sampled_from(RECORDED),
       torch_version=st.sampled_from(["2.11.0", "2.14.1"]), other=st.sampled_from(OTHER),
       picks=st.lists(st.floats(0, 1), min_size=3, max_size=3))
def test_generated_streams_replay_the_same_natively(tmp_path, program, conf, torch_version, other, picks):
    path = write_program(str(tmp_path / "p.alsc"), program, conf, torch_version, total=256 * MiB)
    cap = allocscope.load(path)
    n = len(cap.events)
    at = [int(p * n) - 1 for p in picks]
    ref = assert_same(cap, states_at=at)
    # The generator ran the Python model, so the faithful replay follows it
    # exactly; with deferred frees it does not write the FREE_COMPLETED that
    # c10 writes when a release completes them, so there it may not.
    assert ref.fidelity is not None
    if not any(op[0] == "free_deferred" for op in program):
        assert ref.fidelity.exact, ref.fidelity
    event(f"recorded OOMs: {bool(ref.ooms)}; releases: {ref.stats()['num_device_free'] > 0}; "
          f"deferred frees: {any(op[0] == 'free_deferred' for op in program)}")
    assert_same(cap, config=other, states_at=at)
    assert_same(cap, limit=96 * MiB, states_at=at[:1])
    assert_same(cap, stop_after=at[1])


def test_reports_replay_long_captures_whole_where_the_native_replay_can():
    from allocscope.reports.report import analyse

    train = allocscope.load(os.path.join(DATA, "cuda_train_v1.alsc"))
    an = analyse(train, replay_budget=10)
    assert an.replay is not None and an.replay.replayed_until == len(train.events) - 1
    assert not any("replayed up to event" in w for w in an.warnings)
    expandable = allocscope.load(os.path.join(DATA, "cuda_fragment_expandable_v1.alsc"))
    an = analyse(expandable, replay_budget=10)
    # its peak comes before its end: the Python replay stops there, and says so
    assert an.replay is not None and an.replay.replayed_until < len(expandable.events) - 1
    assert any("replayed up to event" in w for w in an.warnings)
