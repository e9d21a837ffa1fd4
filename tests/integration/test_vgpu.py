"""The virtual GPU itself (run on it: pytest --vgpu H100-80GB; skipped on a
real GPU): what torch reads of the devices, device memory through torch's
real caching allocator (full device, memory fraction, empty_cache, snapshots),
streams and events, graph capture, and what it costs the host."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import allocscope
from allocscope import EventKind, vgpu

from ..support.cuda_runtime import cudart

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not vgpu.active(), reason="checks the virtual GPU itself")]

MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture(autouse=True)
def clean_cuda():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def on_vgpu(code: str, gpu: str, **settings) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter on a virtual GPU of its own."""
    env = vgpu.environment(gpu, **settings)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_preset_as_torch_reports_it():
    presets = vgpu.presets()
    assert {"H100-80GB", "H200-141GB", "A100-80GB", "A100-40GB", "L4-24GB", "RTX4090-24GB", "T4-16GB",
            "V100-16GB"} <= {p.key for p in presets}
    mig = [p for p in presets if "-MIG-" in p.key]
    assert {p.key.split("-MIG-")[0] for p in mig} == {"H100-80GB", "H200-141GB", "A100-80GB", "A100-40GB"}
    # one process per 16 presets (the most devices a process can have), one
    # device per preset, each with its own memory but the last, given 3 GiB
    # (fit's tests hold a card's own memory over everyone's --gpu-memory)
    for first in range(0, len(presets), 16):
        group = presets[first:first + 16]
        out = on_vgpu("""
            import json, torch
            devices = []
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                free, total = torch.cuda.mem_get_info(i)
                devices.append([p.name, p.total_memory, p.major, p.minor, p.multi_processor_count, total])
            print(json.dumps(devices))
        """, ",".join(p.key for p in group) + ":3GiB")
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout)
        expected = [[p.name, p.total_memory, p.major, p.minor, p.multi_processor_count, p.total_memory]
                    for p in group]
        expected[-1][1] = expected[-1][5] = 3 * GiB
        assert seen == expected
    assert vgpu.parse_gpus("2xA100-40GB:12GiB")[1].total_memory == 12 * GiB
    assert vgpu.device_spec(vgpu.parse_gpus("L4-24GB,2xA100-40GB:12GiB")) == (
        f"L4-24GB,A100-40GB:{12 * GiB},A100-40GB:{12 * GiB}")
    for bad in ("A100-40GB:lots", "A100-40GB:1MiB", "A100-40GB-MIG-9g.99gb"):
        with pytest.raises(vgpu.VirtualGpuError):
            vgpu.parse_gpus(bad)


def test_memory_override_and_context_share():
    out = on_vgpu("""
        import json, torch
        from allocscope import vgpu
        before = vgpu.state()["devices"][0]["used"]     # no context yet
        free, total = torch.cuda.mem_get_info()         # creates it
        x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
        free2, _ = torch.cuda.mem_get_info()
        print(json.dumps([before, free, total, free2, torch.cuda.memory_reserved()]))
    """, "A100-40GB", memory="12GiB", context="300MiB")
    assert out.returncode == 0, out.stderr
    before, free, total, free2, reserved = json.loads(out.stdout)
    assert before == 0 and total == 12 * GiB and free == total - 300 * MiB
    assert reserved == 100 * MiB and free2 == free - reserved  # device used = context + reserved


def test_allocating_the_whole_device_then_one_more_segment():
    free, total = torch.cuda.mem_get_info()
    assert total == torch.cuda.get_device_properties(0).total_memory
    fits = free // (2 * MiB) * (2 * MiB)  # segments are whole 2 MiB pages
    x = torch.empty(fits, dtype=torch.uint8, device="cuda")
    assert torch.cuda.mem_get_info()[0] == free - fits
    with pytest.raises(torch.cuda.OutOfMemoryError, match="GPU 0 has a total capacity of"):
        torch.empty(2 * MiB + 1, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.empty_cache()
    assert torch.cuda.mem_get_info()[0] == free


def test_an_allocation_past_the_device_is_a_recorded_oom(tmp_path):
    total = torch.cuda.get_device_properties(0).total_memory
    path = tmp_path / "oom.alsc"
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with allocscope.record(path, device="cuda"):
            free = torch.cuda.mem_get_info()[0]
            torch.empty(total, dtype=torch.uint8, device="cuda")
    cap = allocscope.load(path)
    ev = cap.events
    (oom,) = np.flatnonzero(ev.kind == EventKind.OOM)
    assert ev.size[oom] == total and ev.arg[oom] == free  # the device's free bytes, as c10 read them
    assert cap.complete and cap.metadata["virtual_gpu"]["devices"][0]["total"] == total


def test_memory_fraction_and_empty_cache_as_c10_does():
    total = torch.cuda.get_device_properties(0).total_memory
    held = torch.cuda.memory_reserved()  # by tensors of earlier tests still alive (graphs' pools, ...)
    torch.cuda.set_per_process_memory_fraction(0.25)
    allowed = int(0.25 * total)
    x = torch.empty(allowed // 2, dtype=torch.uint8, device="cuda")
    with pytest.raises(torch.cuda.OutOfMemoryError, match="allowed"):
        torch.empty(allowed // 2 + 64 * MiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_stats()["num_ooms"] >= 1
    del x
    cached = torch.cuda.memory_reserved()
    assert cached >= allowed // 2  # freed, but cached
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == held
    device = vgpu.state()["devices"][0]
    assert device["used"] == device["context_bytes"] + held  # every segment was given back to the device


def test_snapshot_segments_equal_the_captures_end_baseline(tmp_path):
    import gc

    path = tmp_path / "snap.alsc"
    # The snapshot and the end baseline are two readings, moments apart: a
    # garbage collection in between (of an earlier test's CUDA tensors in
    # reference cycles) would free blocks between them.
    gc.collect()
    gc.disable()
    try:
        with allocscope.record(path, device="cuda"):
            keep = [torch.empty(n, device="cuda") for n in (100, 300_000, 3_000_000, 7_000_000)]
            for _ in range(3):
                y = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
                del y
            del keep[1]
            snapshot = torch.cuda.memory_snapshot()
    finally:
        gc.enable()
    ours = allocscope.load(path).baseline("end")["segments"]
    assert len(ours) == len(snapshot) > 1
    by_address = {s["address"]: s for s in ours}
    for s in snapshot:
        mine = by_address[s["address"]]
        assert (mine["total_size"], mine["stream"], mine["is_large"]) == (s["total_size"], s["stream"],
                                                                          s["segment_type"] == "large")
        assert mine["blocks"] == [[b["size"], b["requested_size"], b["state"] == "active_allocated",
                                   b["state"] != "inactive"] for b in s["blocks"]]


def test_copies_and_sets_are_real_kernels_compute_nothing():
    values = torch.arange(1, 1001, dtype=torch.float32)
    on_device = values.cuda()
    assert torch.equal(on_device.cpu(), values)  # memcpy host -> device -> host
    assert torch.equal(on_device.clone().cpu(), values)  # device -> device
    assert cudart().cudaMemset(ctypes_ptr(on_device), 0, 400) == 0  # the first 100 floats
    assert torch.count_nonzero(on_device.cpu()).item() == 900
    doubled = on_device * 2  # a kernel: runs nothing, so the output is whatever the block held
    assert doubled.shape == values.shape and doubled.device.type == "cuda"
    # device memory given back to the device is out of reach, as on a card
    gone = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # a segment of its own
    ptr = ctypes_ptr(gone)
    del gone
    torch.cuda.empty_cache()
    runtime = cudart()
    assert runtime.cudaMemset(ptr, 0, 16) == 1  # cudaErrorInvalidValue
    assert runtime.cudaGetLastError() == 1 and runtime.cudaGetLastError() == 0


def test_kernels_compiled_at_run_time_by_nvrtc_launch():
    # torch's jiterator compiles some ops with NVRTC when first used; NVRTC
    # opens libcuda.so.1 (the stand-in, once loaded) and calls
    # cuGetExportTable, which the stand-in lacked: the process died at
    # address 0 (a fresh interpreter, so that a crash fails only this test).
    out = on_vgpu("""
        import torch
        x = torch.ones(1000, device="cuda")
        y = torch.special.i1e(x)  # jitted: NVRTC, cuModuleLoadData, cuLaunchKernel
        torch.cuda.synchronize()
        print(y.shape[0], y.dtype)
    """, "H100-80GB")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1000", "torch.float32"]


def ctypes_ptr(t):
    import ctypes

    return ctypes.c_void_p(t.data_ptr())


def test_events_pend_for_one_query_and_a_busy_stream_until_it_is_synchronized():
    side = torch.cuda.Stream()
    event = torch.cuda.Event()
    event.record(side)
    assert not event.query()  # the first query: still running
    assert event.query()  # the next: done
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)  # a busy kernel
    busy = torch.cuda.Event()
    busy.record(side)
    assert not any(busy.query() for _ in range(5))
    side.synchronize()
    assert busy.query()


def test_memory_costs_no_host_memory_until_written():
    out = on_vgpu("""
        import json, torch
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
        torch.empty(1, device="cuda")  # CUDA and the allocator up
        before = rss()
        held = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(60)]  # 60 GiB, never written
        zeros = torch.zeros(10 << 30, dtype=torch.uint8, device="cuda")  # 10 GiB, a fill kernel: runs nothing
        after = rss()
        # written memory costs what it holds; set back to zero, it costs nothing again
        import ctypes, os
        from allocscope import vgpu
        (name,) = [n for n in os.listdir(vgpu.LIB_DIR) if n.startswith("libcudart.so.")]
        cudart = ctypes.CDLL(os.path.join(vgpu.LIB_DIR, name))
        written = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        ptr = ctypes.c_void_p(written.data_ptr())
        assert cudart.cudaMemset(ptr, 1, 256 << 20) == 0
        full = rss()
        assert cudart.cudaMemset(ptr, 0, 256 << 20) == 0
        cleared = rss()
        print(json.dumps([torch.cuda.memory_allocated(), before, after, full, cleared, int(written.cpu().sum())]))
    """, "H100-80GB")
    assert out.returncode == 0, out.stderr
    allocated, before, after, full, cleared, total = json.loads(out.stdout)
    assert allocated == 70 * GiB + 256 * MiB
    assert after - before < GiB, (before, after)
    assert full - after >= 250 * MiB and full - cleared >= 250 * MiB and total == 0


def test_copies_of_memory_never_written_cost_no_host_memory():
    out = on_vgpu("""
        import json, torch
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
        src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # never written
        src[12345:12345 + (3 << 20)].copy_(torch.full((3 << 20,), 7, dtype=torch.uint8))  # 3 MiB written, unaligned
        before = rss()
        dst = src.clone()  # a device-to-device cudaMemcpyAsync
        after = rss()
        view = dst[:8 << 20].cpu()
        odd = src[100:(1 << 30) - 100].clone()  # source and destination at different page offsets
        odd_view = odd[:8 << 20].cpu()
        print(json.dumps([after - before, int((view == 7).sum()), int(view[12345:12345 + (3 << 20)].min()),
                          int(view[:12345].sum()) + int(view[12345 + (3 << 20):].sum()),
                          int((odd_view == 7).sum()), int(odd_view[12245].item()), int(odd_view[12244].item())]))
    """, "H100-80GB")
    assert out.returncode == 0, out.stderr
    cost, sevens, smallest, others, odd_sevens, odd_first, odd_before = json.loads(out.stdout)
    assert sevens == 3 << 20 and smallest == 7 and others == 0  # the same bytes as a plain copy
    assert odd_sevens == 3 << 20 and (odd_first, odd_before) == (7, 0)
    assert cost < 64 * MiB, cost  # 1 GiB copied: only the written part costs host memory


def test_a_training_step_captured_in_a_cuda_graph(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), capturable=True)
    x, y = torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(warm)
    path = tmp_path / "graph_step.alsc"
    with allocscope.record(path, device="cuda"):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        torch.cuda.synchronize()
        allocscope.mark("captured")
        reserved = torch.cuda.memory_reserved()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.cuda.memory_reserved() == reserved  # replays allocate nothing
    cap = allocscope.load(path)
    ev = cap.events
    (mark,) = np.flatnonzero(ev.kind == EventKind.MARK)
    assert (ev.kind[:mark] == EventKind.ALLOC).any()  # the capture allocated from its private pool
    assert not (ev.kind[mark:] == EventKind.ALLOC).any()
    pools = {tuple(s["pool"]) for s in cap.baseline("end")["segments"]}
    assert any(p != (0, 0) for p in pools)


@pytest.mark.parametrize("streams", [2, 4])
def test_a_block_freed_in_a_capture_is_reused_once_its_streams_have_joined(tmp_path, streams):
    """graph_capture_record_stream_reuse: c10 reuses, inside a capture, a
    block used on side streams once the capture's dependency graph shows
    every use ends before the next work (PyTorch's
    test_graph_capture_reclaim_*_streams). The stand-in keeps the capture's
    nodes and edges as CUDA does, so the block comes back; recorded, the
    capture replays exactly. Not joined, it is not reused."""
    code = f"""
        import json, sys, torch, allocscope
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        capture = torch.cuda.Stream()
        sides = [torch.cuda.Stream() for _ in range({streams} - 1)]
        torch.cuda.synchronize()
        out = {{}}
        with allocscope.record(sys.argv[1], device="cuda"):
            for join in (True, False):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=capture):
                    data1 = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
                    first = data1.data_ptr()
                    for s in sides:
                        s.wait_stream(capture)
                        with torch.cuda.stream(s):
                            data1.add_(1)
                            data1.record_stream(s)
                    del data1
                    if join:
                        for s in sides:
                            capture.wait_stream(s)
                    torch.ones(4, device="cuda")  # work after the join
                    data3 = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
                    out[join] = data3.data_ptr() == first
                    del data3
                    if not join:
                        for s in sides:
                            capture.wait_stream(s)
                del g
        print(json.dumps(out))
        """
    path = tmp_path / "reclaim.alsc"
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(path)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {"true": True, "false": False}
    from ..replay import assert_exact

    assert_exact(allocscope.load(path))


def test_managed_memory_is_device_memory_the_host_can_touch():
    """cudaMallocManaged (what CUDAPluggableAllocator examples build on):
    charged to the current device, readable and writable from the host,
    given back by cudaFree."""
    import ctypes

    runtime = cudart()  # (the stand-in: these tests run on the virtual GPU)
    torch.cuda.init()
    free_before = torch.cuda.mem_get_info()[0]
    ptr = ctypes.c_void_p()
    assert runtime.cudaMallocManaged(ctypes.byref(ptr), ctypes.c_size_t(64 * MiB), 1) == 0  # cudaMemAttachGlobal
    assert torch.cuda.mem_get_info()[0] == free_before - 64 * MiB
    view = (ctypes.c_uint8 * 16).from_address(ptr.value)
    view[:] = bytes(range(16))
    assert bytes(view) == bytes(range(16))
    assert runtime.cudaMallocManaged(ctypes.byref(ctypes.c_void_p()), ctypes.c_size_t(MiB), 7) != 0  # bad flags
    assert runtime.cudaFree(ptr) == 0
    assert torch.cuda.mem_get_info()[0] == free_before
