"""The CUDA wrapper's bookkeeping, deleters, install/uninstall, tracker
coordination and stack capture, exercised without a GPU: a host-memory fake
stands in for the native caching allocator (csrc/testing/fake_cuda.h says what
it copies from the real one). The real allocator is tested by test_cuda.py on
a GPU."""

import inspect

import numpy as np
import pytest

import allocscope
from allocscope import EventKind
from allocscope.attribution.lifetimes import lifetimes
from allocscope.recording import Recording

KIND = EventKind


def _record(tmp_path, name="fake.alsc"):
    return Recording(tmp_path / name, device="cuda", _check_cuda=False)


def _events_of(cap, kind, via=False):
    ev = cap.events
    return np.flatnonzero((ev.kind == kind) & (ev.via_allocator == via))


def test_every_method_reaches_the_wrapped_allocator(fake_cuda, native, tmp_path):
    rec = _record(tmp_path).start()
    try:
        assert native.cuda_installed() and native.cuda_tracker_attached()
        assert native.cuda_wrapped_name() == "fake"
        assert fake_cuda.fake_check_forwarding() == []
    finally:
        rec.stop()
    assert not native.cuda_installed()


def test_allocations_and_frees_are_recorded_once_with_their_stack(fake_cuda, tmp_path):
    rec = _record(tmp_path).start()
    line = inspect.currentframe().f_lineno + 1
    a = fake_cuda.fake_allocate(3000)
    b = fake_cuda.fake_allocate(5000, release_gil=True)  # walked without the GIL
    addr_a = a.ptr
    a.free()
    c = fake_cuda.fake_allocate(3000)  # reuses a's cached block: same address
    addr_c = c.ptr
    del b, c
    rec.stop()
    cap = allocscope.load(rec.path)
    ev = cap.events
    allocs = _events_of(cap, KIND.ALLOC)
    assert ev.size[allocs].tolist() == [3000, 5000, 3000]  # once each: the tracker's ALLOC is not repeated
    assert len(_events_of(cap, KIND.ALLOC, via=True)) == 0
    assert addr_c == addr_a  # the fake reuses the cached block of the same size and stream
    assert ev.addr[allocs].tolist() == [addr_a, ev.addr[allocs[1]], addr_c] and ev.addr[allocs[1]] != addr_a
    assert (ev.device[allocs] == 0).all()
    for i, expected_line in zip(allocs[:2], (line, line + 1), strict=True):
        top = cap.stack(ev.stack[i])[0]
        assert (top.filename, top.line) == (__file__, expected_line)
    lt = lifetimes(ev)
    assert len(lt.unmatched_frees) == 0 and len(lt.double_allocs) == 0 and len(lt.live_at_end) == 0
    segments = _events_of(cap, KIND.SEGMENT_ALLOC)
    assert ev.size[segments].tolist() == [3072, 5120]  # from the tracker; the reuse needed none
    assert len(_events_of(cap, KIND.FREE_COMPLETED)) == 0  # immediate frees add no event


def test_record_stream_reaches_the_wrapped_allocator_and_defers_the_free(fake_cuda, tmp_path):
    rec = _record(tmp_path).start()
    buf = fake_cuda.fake_allocate(4096)
    addr = buf.ptr
    buf.record_stream(7)
    counters = fake_cuda.fake_counters()
    # The native allocator ignores DataPtrs with a foreign deleter; the wrapper
    # must hand it one it accepts.
    assert counters.get("record_stream_accepted") == 1 and "record_stream_ignored" not in counters
    buf.free()  # deferred: still in use on stream 7
    fake_cuda.fake_process_events()  # the stream's work is done
    rec.stop()
    cap = allocscope.load(rec.path)
    ev = cap.events
    (free,) = _events_of(cap, KIND.FREE, via=True)  # the allocator's own deleter: seen by its trace
    (done,) = _events_of(cap, KIND.FREE_COMPLETED)
    assert ev.addr[free] == ev.addr[done] == addr and free < done
    assert ev.size[done] == 4096


def test_memory_that_bypasses_the_wrapper_is_seen_through_the_tracker(fake_cuda, tmp_path):
    before = fake_cuda.fake_allocate(1024)  # allocated before recording
    before_ptr = before.ptr
    rec = _record(tmp_path).start()
    stale = fake_cuda.fake_allocate(2048, bypass=True)  # through a stale allocator pointer
    before.free()
    stale.free()
    rec.stop()
    cap = allocscope.load(rec.path)
    ev = cap.events
    (alloc,) = _events_of(cap, KIND.ALLOC, via=True)
    assert ev.size[alloc] == 2048 and ev.stack[alloc] == 0
    frees = _events_of(cap, KIND.FREE, via=True)
    assert sorted(ev.size[frees].tolist()) == [1024, 2048]
    start = cap.baseline("start")
    assert [s["address"] for s in start["segments"] if s["allocated_size"]] == [before_ptr]
    lt = lifetimes(ev)
    # The one unmatched free is the block of the start baseline.
    assert ev.addr[lt.unmatched_frees].tolist() == [before_ptr]


def test_a_block_from_one_recording_freed_in_the_next_is_recorded_once(fake_cuda, native, tmp_path):
    # The allocator's DataPtrs keep its own deleter (the wrapper records
    # frees from the allocator's trace entries), so a tensor outliving a
    # recording frees as it would have without allocscope, recorded or not.
    rec = _record(tmp_path, "first.alsc").start()
    survivor = fake_cuda.fake_allocate(700)
    rec.stop()
    assert not native.cuda_installed()
    live = fake_cuda.fake_live_bytes()
    rec2 = _record(tmp_path, "second.alsc").start()
    survivor.free()  # allocated during the first recording, freed during the second
    rec2.stop()
    assert fake_cuda.fake_live_bytes() == live - 1024
    ev = allocscope.load(rec2.path).events
    (i,) = np.flatnonzero(ev.kind == KIND.FREE)
    assert ev.via_allocator[i] and ev.size[i] == 700  # seen by the allocator's trace
    assert not np.any(ev.kind == KIND.FREE_COMPLETED)  # completed at once: not repeated
    late = fake_cuda.fake_allocate(900)  # after uninstall: the fake's own deleter
    assert late.ptr and fake_cuda.fake_counters()["allocate"] >= 1
    late.free()


def test_raw_alloc_and_empty_cache_are_recorded(fake_cuda, tmp_path):
    rec = _record(tmp_path).start()
    fake_cuda.fake_set_stream(0x5000)
    p = fake_cuda.fake_raw_alloc(1500, with_stream=True)
    fake_cuda.fake_raw_delete(p)
    fake_cuda.fake_set_stream(0)
    fake_cuda.fake_empty_cache()
    rec.stop()
    cap = allocscope.load(rec.path)
    ev = cap.events
    (a,) = _events_of(cap, KIND.ALLOC)
    assert ev.addr[a] == p and cap.streams[ev.stream[a]].handle == 0x5000
    assert ev.addr[_events_of(cap, KIND.FREE)].tolist() == [p]
    (empty,) = _events_of(cap, KIND.EMPTY_CACHE)
    seg_free = _events_of(cap, KIND.SEGMENT_FREE)
    assert ev.addr[seg_free].tolist() == [p] and seg_free[0] > empty


def test_oom_leaves_an_event_with_its_stack_and_a_complete_file(fake_cuda, tmp_path):
    rec = _record(tmp_path).start()
    fake_cuda.fake_set_limit(1 << 20)
    keep = fake_cuda.fake_allocate(600 * 1024)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(RuntimeError, match="out of memory"):
        fake_cuda.fake_allocate(700 * 1024)
    rec.stop()
    del keep
    cap = allocscope.load(rec.path)
    assert cap.complete
    ev = cap.events
    (oom,) = _events_of(cap, KIND.OOM)
    assert ev.size[oom] == 700 * 1024 and ev.block[oom] == 700 * 1024
    assert ev.arg[oom] == (1 << 20) - 600 * 1024  # the device's free bytes
    top = cap.stack(ev.stack[oom])[0]
    assert (top.filename, top.line) == (__file__, line)


def test_baselines_mark_their_point_in_the_stream(fake_cuda, tmp_path):
    rec = _record(tmp_path).start()
    buf = fake_cuda.fake_allocate(10_000)
    rec.stop()
    cap = allocscope.load(rec.path)
    start, end = cap.baseline("start"), cap.baseline("end")
    assert start["device_type"] == end["device_type"] == "cuda"
    assert {"expandable_segments", "max_split_size", "roundup_power2_divisions"} <= set(start["config"])
    assert end["devices"][0]["used"] == end["devices"][0]["total"] - end["devices"][0]["free"]
    snapshots = _events_of(cap, KIND.SNAPSHOT)
    (alloc,) = _events_of(cap, KIND.ALLOC)
    assert len(snapshots) == 2 and snapshots[0] < alloc < snapshots[1]
    blocks = {s["address"]: s["blocks"] for s in end["segments"]}
    assert blocks[buf.ptr] == [[10240, 10000, True, True]]
    buf.free()


def test_threads_allocating_through_the_wrapper(fake_cuda, tmp_path):
    import threading

    rec = _record(tmp_path).start()
    errors = []

    def work(size):
        try:
            for _ in range(500):
                fake_cuda.fake_allocate(size, release_gil=True).free()
        except Exception as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(512 * (i + 1),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.stop()
    assert not errors
    ev = allocscope.load(rec.path).events
    lt = lifetimes(ev)
    assert len(lt.alloc) == 2000 and len(lt.unmatched_frees) == 0 and len(lt.double_allocs) == 0
    assert len(np.unique(ev.thread[lt.alloc])) == 4


def test_failures_at_start_and_end_are_clear_and_keep_the_file(fake_cuda, native, tmp_path, monkeypatch, capsys):
    rec = _record(tmp_path)
    monkeypatch.setattr(native, "install_cuda", lambda: (_ for _ in ()).throw(RuntimeError("allocator swapped\nC++ trace")))
    with pytest.raises(allocscope.AllocscopeError, match="^allocator swapped$"):
        rec.start()
    assert not native.is_active() and allocscope.load(rec.path).complete
    monkeypatch.undo()
    rec = _record(tmp_path, "end.alsc").start()
    monkeypatch.setattr(native, "cuda_baseline_json", lambda *a: (_ for _ in ()).throw(RuntimeError("device lost")))
    summary = rec.stop()
    assert summary["events"] >= 1 and "no end baseline: device lost" in capsys.readouterr().err
    cap = allocscope.load(rec.path)
    assert cap.complete and cap.baseline("start") is not None and cap.baseline("end") is None


def test_events_carry_the_start_baseline_to_the_end_baseline(fake_cuda, tmp_path):
    from ..replay import check_start_to_end

    old = [fake_cuda.fake_allocate(n) for n in (1000, 3000)]  # before recording
    rec = _record(tmp_path).start()
    new = [fake_cuda.fake_allocate(n) for n in (2000, 4000, 6000)]
    old[0].free()
    new[1].free()
    fake_cuda.fake_empty_cache()
    rec.stop()
    check_start_to_end(allocscope.load(rec.path))
    for b in old + new:
        b.free()
