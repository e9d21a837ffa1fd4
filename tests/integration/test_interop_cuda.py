"""`allocscope import` of a snapshot PyTorch itself wrote on a GPU: the
same blocks as the snapshot, the peak memory_viz's timeline shows, and a
replay that follows the imported trace."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import allocscope
from allocscope.attribution.lifetimes import live_bytes
from allocscope.interop import import_snapshot

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.cuda


def test_import_of_a_real_dump_snapshot(tmp_path):
    from torch.cuda import _memory_viz

    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        keep = [torch.empty(n, device="cuda") for n in (1000, 300_000, 5_000_000)]
        for _ in range(3):
            x = torch.randn(512, 512, device="cuda")
            y = (x @ x).relu()
            del x, y
        path = str(tmp_path / "snap.pickle")
        torch.cuda.memory._dump_snapshot(path)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    out = str(tmp_path / "snap.alsc")
    import_snapshot(path, out)
    cap = allocscope.load(out)
    end = cap.baseline("end")["segments"]
    assert len(end) == len(snap["segments"])
    for ours, theirs in zip(end, snap["segments"], strict=True):
        assert ours["address"] == theirs["address"] and ours["total_size"] == theirs["total_size"]
        assert [b[0] for b in ours["blocks"]] == [b["size"] for b in theirs["blocks"]]
    assert "total_reserved" in _memory_viz.segsum(snap)
    live = peak = 0
    for e in snap["device_traces"][torch.cuda.current_device()]:
        live += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        peak = max(peak, live)
    assert int(np.max(live_bytes(cap.events))) == peak
    assert len(keep) == 3
