"""The report's allocator state counts the memory of CUDA graphs' own pools
(a serving engine's captured graphs): as torch's snapshot lists it."""

import pytest
import torch

import allocscope
from allocscope.reports.report import build_report

pytestmark = pytest.mark.cuda


def test_private_pools_are_the_snapshots_segments_of_a_private_pool(tmp_path):
    path = tmp_path / "graphs.alsc"
    with allocscope.record(path, device="cuda"):
        x = torch.randn(1 << 20, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up, as torch's docs do it
                y = x * 2 + 1
        torch.cuda.current_stream().wait_stream(side)
        graphs = []
        for _ in range(2):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = (x * 2 + 1).relu()
            graphs.append((g, y))
        # (reserved memory at its peak last: the report's state is at that peak)
        z = torch.empty(64 << 20, device="cuda")
        torch.cuda.synchronize()
        expected = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) != (0, 0)]
    assert expected  # (the test says nothing otherwise)
    state = build_report(allocscope.load(path))["allocator"]["state"]
    assert state["private_pools"] == {
        "segments": len(expected), "reserved": sum(s["total_size"] for s in expected),
        "allocated": sum(b["size"] for s in expected for b in s["blocks"] if b["state"] == "active_allocated")}
    del graphs, z
