"""Recording the real CUDA caching allocator (needs a GPU; skipped elsewhere).

The same checks as on the CPU, plus what only the real allocator can show:
totals against torch's own statistics at every mark, segment events against
memory_reserved(), cross-stream frees, CUDA graphs, empty_cache, snapshots and
history recording while recording, and an OOM."""

import inspect

import numpy as np
import pytest

import allocscope
from allocscope import EventKind
from allocscope.attribution import moment
from allocscope.attribution.lifetimes import lifetimes
from allocscope.reports.report import analyse

from ..replay import baseline_blocks, replay_totals

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def clean_cuda():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    yield
    torch.cuda.synchronize()


def test_totals_match_torch_at_every_mark(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
                          nn.Linear(16 * 30 * 30, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    expected = []
    path = tmp_path / "gpu.alsc"
    with allocscope.record(path, device="cuda"):
        for step in range(3):
            loss = model(torch.randn(32, 3, 32, 32, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            stats = torch.cuda.memory_stats()
            expected.append((stats["requested_bytes.all.current"], torch.cuda.memory_reserved(),
                             torch.cuda.memory_allocated()))
            allocscope.mark(f"step {step}")
    cap = allocscope.load(path)
    assert cap.complete and cap.metadata["devices_recorded"] == ["cuda"]
    marks = np.flatnonzero(cap.events.kind == EventKind.MARK)
    assert len(marks) == 3
    an = analyse(cap)
    assert an.att.blocks_exact  # the replay followed the recording exactly
    for mark, (requested, reserved, allocated) in zip(marks, expected, strict=True):
        live_requested, live_reserved = replay_totals(cap, int(mark))
        assert live_requested == requested
        assert live_reserved == reserved  # segment events add up to memory_reserved()
        # The allocator does not report block sizes per allocation: the
        # exact replay gives them, unsplit remainders included.
        assert int(an.tl.allocated[mark + 1]) == allocated
        m = moment(an.att, int(mark), an.tl)
        assert m.requested_bytes <= m.rounded_bytes <= m.allocated_bytes == allocated
    lt = lifetimes(cap.events)
    assert len(lt.double_allocs) == 0
    start_blocks = baseline_blocks(cap.baseline("start"))
    assert set(cap.events.addr[lt.unmatched_frees].tolist()) <= set(start_blocks)


def test_threads_racing_allocations_and_frees_replay_exactly(tmp_path):
    # One thread's free and another's allocation, recorded in the order the
    # allocator served them: otherwise the replay hands out the freed block
    # where the allocator, not yet having it back, took another (or the
    # reverse). Tensor creation releases the GIL, so the threads do overlap.
    import threading

    from ..replay import assert_exact

    def churn(seed):
        g = torch.Generator().manual_seed(seed)
        held = []
        for _ in range(3000):
            n = int(torch.randint(1, 4096, (1,), generator=g)) * 512
            held.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
            if len(held) > 8:
                held.pop(int(torch.randint(0, len(held), (1,), generator=g)))

    path = tmp_path / "threads.alsc"
    with allocscope.record(path, device="cuda"):
        threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    cap = allocscope.load(path)
    assert len(np.unique(cap.events.thread[cap.events.kind == EventKind.ALLOC])) == 3
    assert_exact(cap)
    assert len(lifetimes(cap.events).double_allocs) == 0


def test_empty_cache_racing_another_threads_frees_replays_exactly(tmp_path):
    # empty_cache() on one thread while another allocates and frees (a
    # backward's last frees on autograd's thread, say): it is sequenced where
    # it held the allocator's lock, or, having released nothing, said so.
    # Sequenced when called, a free just before the lock came after it in
    # the capture and the replay kept (or released) the wrong segments.
    import threading

    from ..replay import assert_exact

    done = threading.Event()

    def churn():
        g = torch.Generator().manual_seed(1)
        held = []
        for _ in range(1500):
            n = int(torch.randint(1, 64, (1,), generator=g)) << 20
            held.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
            if len(held) > 4:
                held.pop(int(torch.randint(0, len(held), (1,), generator=g)))
        done.set()

    path = tmp_path / "empty.alsc"
    with allocscope.record(path, device="cuda"):
        t = threading.Thread(target=churn)
        t.start()
        calls = 0
        while not done.is_set():
            torch.cuda.empty_cache()
            calls += 1
        t.join()
    cap = allocscope.load(path)
    ev = cap.events
    empties = ev.kind == EventKind.EMPTY_CACHE
    assert np.count_nonzero(empties) == calls
    assert np.count_nonzero(empties & (ev.size == 1)) < calls  # some released segments
    from allocscope.allocator.native import can_replay
    from allocscope.allocator.replay import replay

    # (the native engine cannot start from private pools other tests left)
    for engine in ("python", "native") if can_replay(cap) else ("python",):
        f = replay(cap, engine=engine).fidelity
        assert f.first_mismatch is None and f.address_mismatches == 0, (engine, f.first_mismatch)
    assert_exact(cap)


def test_a_checkpointed_pool_restored_replays_exactly(tmp_path):
    # cudagraph trees (mode="reduce-overhead") put a private pool back to a
    # checkpoint before recording another branch: setCheckpointPoolState frees
    # the pool's blocks and allocates the checkpoint's where they were, which
    # is not where a request of that size would land (here: the second of two
    # equal free segments, not the first). Done here as cudagraph_trees.py
    # does it: replay outputs are storages without a deleter.
    from ..replay import assert_exact

    path = tmp_path / "restore.alsc"
    with allocscope.record(path, device="cuda"):
        pool = torch.cuda.graph_pool_handle()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            g1.capture_begin(pool=pool)
            first = torch.empty(3_000_000, device="cuda")  # 12 MB: a segment of its own
            second = torch.empty(3_000_000, device="cuda")  # another
            small = torch.empty(700, device="cuda")
            del first
            g1.capture_end()
        torch.cuda.current_stream().wait_stream(s)
        state = torch._C._cuda_getCheckpointState(0, pool)
        g2 = torch.cuda.CUDAGraph()  # the path goes on, and the pool changes
        with torch.cuda.stream(s):
            g2.capture_begin(pool=pool)
            later = torch.empty(5_000_000, device="cuda")
            g2.capture_end()
        torch.cuda.current_stream().wait_stream(s)
        outputs = []
        for t in (second, small):
            st = t.untyped_storage()
            ptr, nbytes = st.data_ptr(), st.nbytes()
            torch._C._free_And_Remove_DeleterFn(st._cdata)
            outputs.append(torch._C._construct_storage_from_data_pointer(ptr, t.device, nbytes))
        del second, small
        where = outputs[0].data_ptr()
        torch._C._cuda_setCheckpointPoolState(0, state, [later.untyped_storage()._cdata],
                                              [o._cdata for o in outputs])
        del later
        g3 = torch.cuda.CUDAGraph()  # another branch from the checkpoint
        with torch.cuda.stream(s):
            g3.capture_begin(pool=pool)
            branch = torch.empty(3_000_000, device="cuda")
            g3.capture_end()
        torch.cuda.current_stream().wait_stream(s)
        assert branch.data_ptr() != where
        del outputs, branch, g1, g2, g3
        torch.cuda.synchronize()
    cap = allocscope.load(path)
    placed = (cap.events.kind == EventKind.POOL_ALLOC) & (cap.events.size == 1)
    assert np.count_nonzero(placed) >= 3  # the checkpoint's blocks: first's, second's, small's segment
    assert_exact(cap)


def test_recording_after_init_with_live_tensors(tmp_path):
    before = torch.randn(1000, device="cuda")  # allocated before recording
    ptr = before.data_ptr()
    with allocscope.record(tmp_path / "late.alsc", device="cuda"):
        del before
        after = torch.randn(2000, device="cuda")
    cap = allocscope.load(tmp_path / "late.alsc")
    ev = cap.events
    (free,) = np.flatnonzero((ev.kind == EventKind.FREE) & (ev.addr == ptr))
    assert ev.via_allocator[free] and ev.size[free] == 4000  # seen by the allocator's hook
    assert ptr in baseline_blocks(cap.baseline("start"))
    (alloc,) = np.flatnonzero((ev.kind == EventKind.ALLOC) & (ev.size == 8000))
    assert ev.device[alloc] == torch.cuda.current_device() and not ev.via_allocator[alloc]
    assert after.data_ptr() == ev.addr[alloc]


def test_tensors_keep_the_allocators_own_deleter(tmp_path):
    # Torch tells its allocator's memory by the deleter: cudagraph trees free
    # a storage only where _has_Standard_Deleter says so, and
    # _free_And_Remove_DeleterFn refuses any other. Made before, during or
    # after a recording, a tensor answers the same as without allocscope.
    standard = torch._C._has_Standard_Deleter
    before = torch.empty(1000, device="cuda")
    with allocscope.record(tmp_path / "deleters.alsc", device="cuda"):
        during = torch.empty(1000, device="cuda")
        assert standard(before.untyped_storage()._cdata) and standard(during.untyped_storage()._cdata)
        ptr = during.data_ptr()
        torch._C._free_And_Remove_DeleterFn(during.untyped_storage()._cdata)  # frees the block
        del during
    kept = torch.empty(1000, device="cuda")
    assert standard(kept.untyped_storage()._cdata)
    with allocscope.record(tmp_path / "again.alsc", device="cuda"):
        assert standard(kept.untyped_storage()._cdata)
    ev = allocscope.load(tmp_path / "deleters.alsc").events
    assert np.count_nonzero((ev.kind == EventKind.FREE) & (ev.addr == ptr)) == 1


def test_record_stream_keeps_memory_from_early_reuse(tmp_path):
    side = torch.cuda.Stream()
    n = 64 << 20
    with allocscope.record(tmp_path / "streams.alsc", device="cuda"):
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        ptr = x.data_ptr()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(1e9))  # keep the side stream busy
            y = x + 1
        x.record_stream(side)
        del x
        z = torch.empty(n, dtype=torch.uint8, device="cuda")  # while the side stream still uses x
        reused_early = z.data_ptr() == ptr
        side.synchronize()
        del y, z
        w = torch.empty(n, dtype=torch.uint8, device="cuda")  # completes x's deferred free
        del w
    assert not reused_early
    cap = allocscope.load(tmp_path / "streams.alsc")
    ev = cap.events
    # x's free is the first at ptr (w may reuse the address once it completes)
    free = np.flatnonzero((ev.kind == EventKind.FREE) & (ev.addr == ptr))[0]
    done = np.flatnonzero((ev.kind == EventKind.FREE_COMPLETED) & (ev.addr == ptr))
    assert len(done) == 1 and done[0] > free
    # x, y (made on the side stream), z, w: each allocation names its stream
    allocs = np.flatnonzero((ev.kind == EventKind.ALLOC) & (ev.size == n))
    main, other = torch.cuda.current_stream().cuda_stream, side.cuda_stream
    assert [cap.streams[s].handle for s in ev.stream[allocs]] == [main, other, main, main]


def _capture_a_graph(model, static_x):
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    return graph, static_y


def test_cuda_graph_capture_inside_the_block(tmp_path):
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    static_x = torch.randn(16, 64, device="cuda")
    with allocscope.record(tmp_path / "graph.alsc", device="cuda"):
        graph, static_y = _capture_a_graph(model, static_x)
        ptr = static_y.data_ptr()
        graph.replay()
        torch.cuda.synchronize()
        after = model(static_x)  # outside the graph: the default pool again
        del after
    cap = allocscope.load(tmp_path / "graph.alsc")
    assert cap.complete
    ev = cap.events
    # the graph's output lives in the graph's private pool: its own segment,
    # which c10 allocated during the capture and keeps for replays
    first = np.flatnonzero((ev.kind == EventKind.ALLOC) & (ev.addr == ptr))[0]
    segments = np.flatnonzero(ev.kind == EventKind.SEGMENT_ALLOC)
    assert any(ev.addr[s] <= ptr < ev.addr[s] + ev.size[s] and s < first for s in segments)
    pools = {tuple(s["pool"]) for s in cap.baseline("end")["segments"]
             if s["address"] <= ptr < s["address"] + s["total_size"]}
    assert len(pools) == 1 and pools != {(0, 0)}


@pytest.mark.gpu_hardware("compares a graph replay's results with eager kernels")
def test_cuda_graph_replay_computes_what_eager_mode_does(tmp_path):
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    static_x = torch.randn(16, 64, device="cuda")
    with allocscope.record(tmp_path / "graph.alsc", device="cuda"):
        graph, static_y = _capture_a_graph(model, static_x)
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_y, model(static_x))
    assert allocscope.load(tmp_path / "graph.alsc").complete


def test_empty_cache_stats_snapshot_and_history_keep_working(tmp_path):
    with allocscope.record(tmp_path / "cache.alsc", device="cuda"):
        torch.cuda.memory._record_memory_history(max_entries=1000)
        x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        del x
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        after = torch.cuda.memory_reserved()
        stats = torch.cuda.memory_stats()
        backend = torch.cuda.get_allocator_backend()
    assert after <= before - (100 << 20)
    assert stats["allocated_bytes.all.current"] == torch.cuda.memory_allocated()
    assert backend == "native"
    traces = [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
    assert any(e["size"] == 100 << 20 for e in traces)
    cap = allocscope.load(tmp_path / "cache.alsc")
    ev = cap.events
    empties = np.flatnonzero(ev.kind == EventKind.EMPTY_CACHE)
    freed = np.flatnonzero(ev.kind == EventKind.SEGMENT_FREE)
    assert len(empties) >= 1 and any(i > empties[-1] and ev.size[i] >= 100 << 20 for i in freed)


def test_oom_inside_the_block_leaves_an_oom_event_and_a_complete_file(tmp_path):
    path = tmp_path / "oom.alsc"
    line = None
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with allocscope.record(path, device="cuda"):
            line = inspect.currentframe().f_lineno + 1
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    cap = allocscope.load(path)
    assert cap.complete
    ev = cap.events
    (oom,) = np.flatnonzero(ev.kind == EventKind.OOM)
    assert ev.size[oom] == 1 << 50 and ev.block[oom] >= 1 << 50 and ev.arg[oom] > 0
    top = cap.stack(ev.stack[oom])[0]
    assert (top.filename, top.line) == (__file__, line)


def test_run_starts_recording_when_the_script_initializes_cuda(tmp_path):
    import os
    import subprocess
    import sys

    from ..conftest import ROOT

    script = os.path.join(ROOT, "examples", "train.py")
    out = tmp_path / "run.alsc"
    result = subprocess.run([sys.executable, "-m", "allocscope", "run", "--device", "cuda", "-o", str(out), "--",
                             sys.executable, script, "--steps", "2", "--device", "cuda"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    cap = allocscope.load(out)
    assert cap.complete and cap.metadata["devices_recorded"] == ["cuda"]
    ev = cap.events
    allocs = np.flatnonzero((ev.kind == EventKind.ALLOC) & ~ev.via_allocator)
    assert (ev.device[allocs] >= 0).all()
    files = {f.filename for i in allocs for f in cap.stack(ev.stack[i])}
    assert script in files
    assert (ev.kind == EventKind.SEGMENT_ALLOC).any()
