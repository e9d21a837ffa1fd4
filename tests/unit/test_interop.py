"""Interoperability with PyTorch's memory snapshots and with Perfetto:
import of hand-built `_dump_snapshot` pickles (the same blocks and peak as
torch's own _memory_viz reads), refusal of pickles that would run code,
exact round trips through `export --format memory-viz`, Perfetto JSON."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

import allocscope
from tests.support.training_run import training_run
from allocscope.attribution.lifetimes import live_bytes
from allocscope.reports.report import build_report
from allocscope.cli import main
from allocscope.interop import SnapshotError, export_memory_viz, import_snapshot, read_snapshot

pytestmark = pytest.mark.torch_agnostic

memory_viz = pytest.importorskip("torch.cuda._memory_viz")

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
MiB = 1 << 20
SEG = 0x7F0000000000


def frames(line):
    return [{"filename": "train.py", "line": line, "name": "step"}, {"filename": "train.py", "line": 99, "name": "main"}]


def hand_snapshot():
    """What torch writes for: x = 3 MiB, y = 1000 B on a side stream, del x,
    z = 2 MiB (reuses x's block), a segment of 20 MiB and one of 2 MiB;
    y's free waits for its stream; an OOM of 80 GiB at the end."""
    t = iter(range(1000, 10**6, 10))
    e = lambda action, addr, size, stream=0, f=None, **kw: dict(  # noqa: E731
        action=action, addr=addr, size=size, stream=stream, time_us=next(t), frames=f or [], **kw)
    trace = [
        e("segment_alloc", SEG, 20 * MiB), e("alloc", SEG, 3 * MiB, f=frames(10)),
        e("segment_alloc", SEG + 32 * MiB, 2 * MiB, stream=7), e("alloc", SEG + 32 * MiB, 1000, stream=7, f=frames(11)),
        e("free_requested", SEG, 3 * MiB), e("free_completed", SEG, 3 * MiB),
        e("alloc", SEG, 2 * MiB, f=frames(12)),
        e("free_requested", SEG + 32 * MiB, 1000, stream=7), e("alloc", SEG + 2 * MiB, 512, f=frames(13)),
        e("free_completed", SEG + 32 * MiB, 1000, stream=7),
        {"action": "oom", "size": 80 << 30, "device_free": 5 * MiB, "stream": 0, "time_us": next(t), "frames": frames(14)},
    ]
    segments = [
        {"device": 0, "address": SEG, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 2 * MiB + 512, "active_size": 2 * MiB + 512,
         "requested_size": 2 * MiB + 512, "blocks": [
             {"address": SEG, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated", "frames": frames(12)},
             {"address": SEG + 2 * MiB, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": frames(13)},
             {"address": SEG + 2 * MiB + 512, "size": 18 * MiB - 512, "requested_size": 0, "state": "inactive",
              "frames": []}]},
        {"device": 0, "address": SEG + 32 * MiB, "total_size": 2 * MiB, "stream": 7, "segment_type": "small",
         "segment_pool_id": (0, 0), "allocated_size": 0, "active_size": 0, "requested_size": 0, "blocks": [
             {"address": SEG + 32 * MiB, "size": 2 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]},
    ]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                   "roundup_power2_divisions": [1] * 16}}


def trace_peak(snapshot):
    """Active memory's peak as memory_viz counts it: from alloc to free_completed."""
    live = peak = 0
    for e in snapshot["device_traces"][0]:
        live += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        peak = max(peak, live)
    return peak


def write_pickle(tmp_path, obj, name="snap.pickle"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj))
    return str(path)


def test_import_keeps_every_block_and_the_peak_torch_reads(tmp_path):
    snap = hand_snapshot()
    out = str(tmp_path / "snap.alsc")
    import_snapshot(write_pickle(tmp_path, snap), out)
    cap = allocscope.load(out)
    ev = cap.events
    K = allocscope.EventKind
    assert (ev.kind == K.ALLOC).sum() == 4 and (ev.kind == K.FREE).sum() == 2
    assert (ev.kind == K.FREE_COMPLETED).sum() == 1  # only y's free waited for its stream
    assert (ev.kind == K.SEGMENT_ALLOC).sum() == 2 and (ev.kind == K.OOM).sum() == 1
    allocs = np.flatnonzero(ev.kind == K.ALLOC)
    assert ev.size[allocs].tolist() == [3 * MiB, 1000, 2 * MiB, 512]
    assert [str(f) for f in cap.stack(int(ev.stack[allocs[2]]))] == ["step (train.py:12)", "main (train.py:99)"]
    # Per-block sizes: what torch's segsum reads from the snapshot, block for block.
    end = cap.baseline("end")["segments"]
    for ours, theirs in zip(end, snap["segments"], strict=True):
        assert [b[0] for b in ours["blocks"]] == [b["size"] for b in theirs["blocks"]]
        assert [b[1] for b in ours["blocks"] if b[2]] == [b["requested_size"] for b in theirs["blocks"]
                                                          if b["state"] == "active_allocated"]
    text = memory_viz.segsum(snap)
    reserved = sum(s["total_size"] for s in end)
    assert f"total_reserved: {memory_viz.Bytes(reserved)}" in text
    assert max(live_bytes(ev)) == trace_peak(snap)
    assert cap.baseline("start")["segments"] == []  # the trace made every segment


def test_import_rebuilds_the_state_before_a_partial_trace(tmp_path):
    snap = hand_snapshot()
    snap["device_traces"][0] = snap["device_traces"][0][6:]  # the ring buffer lost the first entries
    cap = allocscope.load(import_snapshot(write_pickle(tmp_path, snap), tmp_path / "p.alsc")["path"])
    start = {s["address"]: s for s in cap.baseline("start")["segments"]}
    # Both segments existed; y (1000 B, freed in the trace) was live at the start.
    assert set(start) == {SEG, SEG + 32 * MiB}
    assert start[SEG + 32 * MiB]["blocks"][0][:3] == [1024, 1000, True]
    assert sum(b[0] for b in start[SEG]["blocks"]) == 20 * MiB
    report = build_report(cap)
    assert report["capture"]["events"] == len(cap.events)


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(os.environ.get("TMPDIR", "/tmp"), "allocscope-pwned"),))


def test_a_pickle_that_would_run_code_is_refused(tmp_path, capsys):
    marker = os.path.join(os.environ.get("TMPDIR", "/tmp"), "allocscope-pwned")
    if os.path.exists(marker):
        os.remove(marker)
    evil = write_pickle(tmp_path, {"segments": [], "device_traces": [[RunsCode()]]}, "evil.pickle")
    with pytest.raises(SnapshotError, match="refused"):
        read_snapshot(evil)
    assert main(["import", evil, "-o", str(tmp_path / "evil.alsc")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "posix.system" in err and "refused" in err
    assert not os.path.exists(marker) and not os.path.exists(tmp_path / "evil.alsc")


@pytest.mark.parametrize("content, message", [
    (b"not a pickle at all", "not a readable pickle"),
    (pickle.dumps({"segments": []})[:-5], "not a readable pickle"),
    (pickle.dumps([1, 2, 3]), "not a PyTorch memory snapshot"),
    (pickle.dumps({"segments": [{"address": "x"}], "device_traces": []}), "malformed snapshot"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x"}]]}), "malformed snapshot"),
])
def test_bad_snapshots_get_a_one_line_error(tmp_path, capsys, content, message):
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert main(["import", str(path), "-o", str(tmp_path / "bad.alsc")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0


def assert_same_capture(a, b):
    for col in ("seq", "time_ns", "kind", "via_allocator", "thread", "stream", "device", "addr", "size", "block",
                "arg"):
        assert np.array_equal(getattr(a.events, col), getattr(b.events, col)), col
    stacks = {(int(x), int(y)) for x, y in zip(a.events.stack, b.events.stack, strict=True)}
    assert all(a.stack(x) == b.stack(y) for x, y in stacks)
    assert a.baselines == b.baselines and a.metadata == b.metadata
    assert a.threads == b.threads and a.streams == b.streams
    assert [a.label(i) for i in range(len(a.events)) if a.events.kind[i] >= 16] == \
        [b.label(i) for i in range(len(b.events)) if b.events.kind[i] >= 16]


@pytest.mark.parametrize("source", ["cpu_watch_v1.alsc", "synthetic-cuda"])
def test_memory_viz_export_round_trips_through_import(tmp_path, source):
    if source == "synthetic-cuda":
        path = str(tmp_path / "run.alsc")
        training_run(path, 5000, device="cuda", layers=3, hidden=256, batch=64)
    else:
        path = os.path.join(DATA, source)
    cap = allocscope.load(path)
    snap_path = str(tmp_path / "out.pickle")
    assert main(["export", path, "--format", "memory-viz", "-o", snap_path]) == 0
    snap = read_snapshot(snap_path)  # our own reader accepts what we write: plain data only
    memory_viz.segsum(snap)  # torch's own tools read it (segsum checks every segment adds up)
    memory_viz.trace(snap)
    assert main(["import", snap_path, "-o", str(tmp_path / "back.alsc")]) == 0
    back = allocscope.load(tmp_path / "back.alsc")
    assert_same_capture(cap, back)
    r1, r2 = build_report(cap), build_report(back)
    r1["capture"].pop("path"), r2["capture"].pop("path")
    assert r1 == r2


def test_memory_viz_export_is_what_torch_expects(tmp_path):
    path = str(tmp_path / "run.alsc")
    training_run(path, 3000, device="cuda", layers=2, hidden=256, batch=64)
    cap = allocscope.load(path)
    export_memory_viz(cap, tmp_path / "s.pickle")
    snap = read_snapshot(tmp_path / "s.pickle")
    trace = snap["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert len(allocs) == int((cap.events.kind == allocscope.EventKind.ALLOC).sum())
    assert all(e["frames"] and {"filename", "line", "name"} <= set(e["frames"][0]) for e in allocs)
    # Every free is requested and completed, with the block's size, as torch records it.
    live, completed = {}, 0
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] in ("free_requested", "free_completed"):
            assert e["size"] == live[e["addr"]]
            if e["action"] == "free_completed":
                del live[e["addr"]]
                completed += 1
    assert completed == len([e for e in trace if e["action"] == "free_requested"]) > 0
    end_live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert end_live == sum(b[0] for s in cap.baseline("end")["segments"] for b in s["blocks"] if b[2])
    assert all(b["frames"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")


def test_perfetto_export_has_a_counter_track_per_category(tmp_path):
    path = os.path.join(DATA, "cpu_watch_v1.alsc")
    out = tmp_path / "t.json"
    assert main(["export", path, "--format", "perfetto", "-o", str(out), "--points", "500"]) == 0
    trace = json.loads(out.read_text())
    counters = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append(e["args"]["bytes"])
    report = build_report(allocscope.load(path))
    live_categories = {c for c, b in report["peak"]["by_category"].items() if b}
    assert {f"{c} (bytes)" for c in live_categories} <= set(counters)
    assert max(counters["allocated (bytes)"]) == report["peak"]["allocated_bytes"]
    peak_cat = max(live_categories, key=lambda c: report["peak"]["by_category"][c])
    assert max(counters[f"{peak_cat} (bytes)"]) >= report["peak"]["by_category"][peak_cat]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(report["iterations"])
    assert all(len(v) <= 500 for v in counters.values())
