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


@pytest.mark.parametrize("conf", ["", "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:4,"
                                      "garbage_collection_threshold:0.7",
                                  "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"])
def test_imported_settings_are_the_ones_torch_ran_with(tmp_path, conf):
    """allocator_settings as _dump_snapshot writes it (torch 2.11 and 2.14:
    divisions keyed by interval, no limit as -1) reads back as the settings
    string torch parsed."""
    import subprocess
    import sys

    from allocscope.allocator.config import parse_alloc_conf, recorded_config

    from ..support.environment import with_alloc_conf

    path = tmp_path / "snap.pickle"
    code = ("import sys, torch; torch.cuda.memory._record_memory_history(max_entries=100); "
            "x = torch.empty(3 << 20, device='cuda'); del x; torch.cuda.memory._dump_snapshot(sys.argv[1])")
    env = with_alloc_conf(conf)
    subprocess.run([sys.executable, "-c", code, str(path)], env=env, check=True, capture_output=True, timeout=120)
    out = str(tmp_path / "snap.alsc")
    import_snapshot(str(path), out)
    cap = allocscope.load(out)
    assert recorded_config(cap.baseline("start"), cap.metadata) == parse_alloc_conf(conf)
