"""Replaying CUDA captures built by hand: the recorded segment events and
end snapshots below are what torch's allocator does for these requests
(derived by hand from ../shared/torch_internals.md §3), so a faithful replay
must reproduce them exactly, and a capture that disagrees must be caught."""

import json

import pytest

import allocscope
from allocscope.capture.format import EventKind
from allocscope.capture.writer import CaptureWriter
from allocscope.allocator.replay import NotACudaCapture, replay
from allocscope.reports.report import analyse, build_report
from allocscope.allocator.whatif import suggest
from allocscope.cli import main

pytestmark = pytest.mark.torch_agnostic

MiB, GiB = 1 << 20, 1 << 30
S1, S2 = 0x7F0000000000, 0x7F0000200000  # two recorded segment addresses
TOTAL = 1 * GiB


def cuda_capture(tmp_path, *, segments=(), fraction=None, conf="", free=TOTAL, reserved=0):
    b = CaptureWriter({"torch": "2.11.0", "cuda_devices": [{"index": 0, "total_memory": TOTAL}]}, device=0)
    device = {"index": 0, "free": free, "total": TOTAL, "used": TOTAL - free,
              "stats": {"reserved_bytes": {"current": reserved, "peak": reserved}}}
    if fraction is not None:
        device["memory_fraction"] = fraction
    b.baseline({"label": "start", "device_type": "cuda", "seq": 0, "segments": list(segments),
                "config": {"max_split_size": (1 << 64) - 1, "garbage_collection_threshold": 0.0,
                           "expandable_segments": "expandable_segments:True" in conf,
                           "last_allocator_settings": conf, "roundup_power2_divisions": [0] * 16},
                "devices": [device]})
    b.path = tmp_path / "c.alsc"
    return b


def seg(addr, kind, size, b):
    b.event(kind, addr=addr, size=size)


def write_scenario(tmp_path, *, wrong=False):
    """x = 1000 B, y = z = 3 MiB; free x, y; empty_cache()."""
    b = cuda_capture(tmp_path)
    st = b.default_stream
    s = b.stack([("train.py", "step", 7)])
    seg(S1, EventKind.SEGMENT_ALLOC, 2 * MiB, b)  # x: small pool, new 2 MiB segment
    b.alloc(S1, 1000, stack=s, stream=st)
    seg(S2, EventKind.SEGMENT_ALLOC, (2 if wrong else 20) * MiB, b)  # y: 3 MiB < 10 MiB -> a 20 MiB segment
    b.alloc(S2, 3 * MiB, stack=s, stream=st)
    b.alloc(S2 + 3 * MiB, 3 * MiB, stack=s, stream=st)  # z: the rest of y's segment
    b.free(S1)
    b.free(S2)
    b.event(EventKind.EMPTY_CACHE, stream=0)
    seg(S1, EventKind.SEGMENT_FREE, 2 * MiB, b)  # x's segment is whole again; y's holds z
    b.baseline({"label": "end", "device_type": "cuda", "seq": len(b.events), "segments": [
        {"device": 0, "address": S2, "total_size": 20 * MiB, "stream": 0, "is_large": True, "is_expandable": False,
         "pool": [0, 0], "blocks": [[3 * MiB, 0, False, False], [3 * MiB, 3 * MiB, True, True],
                                    [14 * MiB, 0, False, False]]}]})
    return allocscope.load(b.write(b.path))


def test_faithful_replay_reproduces_segments_addresses_and_end_snapshot(tmp_path):
    cap = write_scenario(tmp_path)
    rep = replay(cap)
    f = rep.fidelity
    assert f.recorded_segment_events == 3 and f.matched == 3 and f.first_mismatch is None
    assert f.allocations == 3 and f.address_mismatches == 0
    assert f.end_snapshot["equal"] and f.exact
    assert rep.peak_reserved == 22 * MiB and rep.reserved[-1] == 20 * MiB


def test_a_capture_the_model_disagrees_with_is_flagged(tmp_path):
    cap = write_scenario(tmp_path, wrong=True)
    f = replay(cap).fidelity
    assert not f.exact
    assert f.first_mismatch["recorded"]["size"] == 2 * MiB and f.first_mismatch["simulated"]["size"] == 20 * MiB


def test_state_at_any_event(tmp_path):
    cap = write_scenario(tmp_path)
    ev = cap.events
    after_z = int([i for i in range(len(ev)) if ev.kind[i] == EventKind.ALLOC][-1])
    rep = replay(cap, states_at=[-1, after_z])
    assert rep.states[-1] == []  # nothing before recording
    state = rep.states[after_z]
    assert [(s.address, s.total_size, [b.state for b in s.blocks]) for s in state] == [
        (S1, 2 * MiB, ["allocated", "inactive"]),
        (S2, 20 * MiB, ["allocated", "allocated", "inactive"])]


def test_start_baseline_is_loaded_as_the_initial_state(tmp_path):
    start = [{"device": 0, "address": S2, "total_size": 20 * MiB, "stream": 0, "is_large": True,
              "is_expandable": False, "pool": [0, 0],
              "blocks": [[4 * MiB, 4 * MiB - 100, True, True], [16 * MiB, 0, False, False]]}]
    b = cuda_capture(tmp_path, segments=start, reserved=20 * MiB, free=TOTAL - 20 * MiB)
    b.alloc(S2 + 4 * MiB, 2 * MiB)  # best fit in the cached 16 MiB: right after the live block
    b.free(S2)  # a block from before recording
    cap = allocscope.load(b.write(b.path))
    rep = replay(cap, states_at=[-1])
    assert [(blk.size, blk.requested, blk.state) for blk in rep.states[-1][0].blocks] == [
        (4 * MiB, 4 * MiB - 100, "allocated"), (16 * MiB, 0, "inactive")]
    assert rep.fidelity.address_mismatches == 0 and rep.fidelity.exact
    assert rep.allocated[-1] == 2 * MiB


def test_cpu_captures_are_refused(tmp_path):
    b = CaptureWriter()
    b.alloc(0x1000, 10)
    with pytest.raises(NotACudaCapture):
        replay(allocscope.load(b.write(tmp_path / "cpu.alsc")))


def oom_capture(tmp_path):
    """Fraction 0.1 of 1 GiB = 107374182 B allowed. Six 12 MiB blocks in their own
    segments (72 MiB); free every other one; a 32 MiB request then fits no cached
    12 MiB block, and 72 + 32 > 102.4 MiB: release the three free unsplit segments
    (SEGMENT_FREE x3), retry: 36 + 32 fits. A 70 MiB request then fails: 68 + 70 > 102.4."""
    b = cuda_capture(tmp_path, fraction=0.1)
    st = b.default_stream
    s = b.stack([("train.py", "forward", 11)])
    addrs = [S1 + k * 16 * MiB for k in range(6)]
    for a in addrs:
        seg(a, EventKind.SEGMENT_ALLOC, 12 * MiB, b)
        b.alloc(a, 12 * MiB, stack=s, stream=st)
    for a in addrs[::2]:
        b.free(a)
    for a in addrs[::2]:
        seg(a, EventKind.SEGMENT_FREE, 12 * MiB, b)
    big = S1 + 200 * MiB
    seg(big, EventKind.SEGMENT_ALLOC, 32 * MiB, b)
    b.alloc(big, 32 * MiB, stack=s, stream=st)
    b.event(EventKind.OOM, size=70 * MiB, block=70 * MiB, arg=TOTAL - 68 * MiB, stack=b.stack(
        [("train.py", "bigger", 42)]), stream=st)
    return allocscope.load(b.write(b.path))


def test_oom_is_reproduced_and_explained(tmp_path):
    cap = oom_capture(tmp_path)
    rep = replay(cap)
    assert rep.fidelity.exact
    assert [o.recorded for o in rep.ooms] == [True]
    r = build_report(cap)
    oom = r["oom"]
    assert oom["reproduced_by_replay"] and oom["request"]["size"] == 70 * MiB
    assert oom["allocator"]["reserved"] == 68 * MiB and oom["allocator"]["cached_free"] == 0
    assert oom["device"]["allowed"] == int(0.1 * TOTAL)
    assert oom["shortfall"] == 68 * MiB + 70 * MiB - int(0.1 * TOTAL)
    assert oom["device"]["outside_pytorch"] == 0  # the device's free bytes at the OOM + reserved = total
    assert oom["filled_by"]["categories"]["other"] == 3 * 12 * MiB + 32 * MiB  # nothing was watched
    assert any("bigger" in f for f in oom["request"]["stack"])
    assert all(not t["avoids_oom"] for t in oom["settings_tried"])  # no setting makes 138 MiB fit in 102.4
    assert r["allocator"]["replay"]["exact"]


def test_fragmentation_oom_avoided_by_expandable_segments(tmp_path):
    # The device has 120 MiB for PyTorch. Requests of 10 MiB + 1 B round to
    # 10 MiB + 512 B; each gets its own 12 MiB segment (>= 10 MiB: rounded up to
    # 2 MiB), split, leaving a ~2 MiB remainder no later request fits. Ten fill
    # 120 MiB; the eleventh cannot get 12 MiB more and nothing is releasable: OOM.
    # With expandable segments the blocks tile one range: eleven need 110 MiB +
    # 5.5 KiB, i.e. six 20 MiB pages = 120 MiB: it fits.
    b = cuda_capture(tmp_path, free=120 * MiB)
    st = b.default_stream
    for k in range(10):
        a = S1 + k * 16 * MiB
        seg(a, EventKind.SEGMENT_ALLOC, 12 * MiB, b)
        b.alloc(a, 10 * MiB + 1, stream=st)
    b.event(EventKind.OOM, size=10 * MiB + 1, block=10 * MiB + 512, arg=0, stream=st)
    cap = allocscope.load(b.write(b.path))
    rep = replay(cap)
    assert rep.fidelity.exact and [o.recorded for o in rep.ooms] == [True]
    ranked = suggest(cap)
    best = ranked[0]
    assert best.settings == "expandable_segments:True" and not best.runs_out
    assert best.avoided_recorded_ooms == 1 and best.peak_reserved == 120 * MiB
    recorded = next(o for o in ranked if o.settings.startswith("recorded"))
    assert recorded.runs_out
    # roundup_power2_divisions:4 rounds each request to 12 MiB: still too big
    assert next(o for o in ranked if o.settings == "roundup_power2_divisions:4").runs_out
    text = "\n".join(str(t) for t in build_report(cap)["oom"]["settings_tried"])
    assert "'settings': 'expandable_segments:True', 'avoids_oom': True" in text


def test_limit_predicts_an_oom_on_a_smaller_gpu(tmp_path):
    cap = write_scenario(tmp_path)
    rep = replay(cap, limit=10 * MiB)  # the 20 MiB segment cannot exist on a 10 MiB device
    assert rep.fidelity is None
    assert [(o.event, o.recorded, o.size) for o in rep.ooms] == [(3, False, 3 * MiB)]


def test_simulate_cli(tmp_path, capsys):
    cap = write_scenario(tmp_path)
    assert main(["simulate", cap.path, "--config", "expandable_segments:True", "--suggest", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recorded"]["fidelity"]["exact"]
    assert out["measured"]["peak_reserved"] == 22 * MiB
    assert out["whatif"]["settings"] == "expandable_segments:True"
    # x maps one 2 MiB page of the small pool's range, y and z one 20 MiB page of the large one's
    assert out["whatif"]["peak_reserved"] == 22 * MiB
    assert main(["simulate", cap.path, "--limit", "10MiB"]) == 0
    text = capsys.readouterr().out
    assert "reproduces this run exactly" in text and "runs out of memory" in text


@pytest.mark.parametrize("argv, message", [
    (["--config", "max_split_size_mb:1"], "max_split_size_mb too small"),
    (["--limit", "lots"], "not a size"),
])
def test_simulate_cli_errors_are_one_line(tmp_path, capsys, argv, message):
    cap = write_scenario(tmp_path)
    assert main(["simulate", cap.path, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_simulate_refuses_cpu_captures(tmp_path, capsys):
    b = CaptureWriter()
    b.alloc(0x1000, 10)
    assert main(["simulate", b.write(tmp_path / "cpu.alsc")]) == 2
    assert "not a CUDA recording" in capsys.readouterr().err


def test_report_has_the_allocator_section(tmp_path, capsys):
    cap = write_scenario(tmp_path)
    r = build_report(cap)
    a = r["allocator"]
    assert a["replay"]["exact"] and a["peak_reserved"]["bytes"] == 22 * MiB
    st = a["state"]  # the peak is first reached by y's segment: x (1000 B in 1 KiB) and y (3 MiB) live
    assert st["reserved"] == 22 * MiB and st["allocated"] == 1024 + 3 * MiB
    assert st["cached_free"] == 22 * MiB - 1024 - 3 * MiB
    assert st["largest_free_block"] == 17 * MiB
    assert st["unreleasable_free"] == st["cached_free"] and st["fragmented_segments"] == 2
    assert st["internal_fragmentation"] == 24
    assert main(["report", cap.path]) == 0
    assert "Allocator" in capsys.readouterr().out


def test_block_sizes_come_from_an_exact_replay(tmp_path):
    """y (3 MiB) freed and its block reused whole by a 2.5 MiB request (the
    0.5 MiB rest is too small to split off in the large pool): allocated
    bytes count the block, and the waterfall names the remainder."""
    b = cuda_capture(tmp_path)
    st = b.default_stream
    seg(S2, EventKind.SEGMENT_ALLOC, 20 * MiB, b)
    b.alloc(S2, 3 * MiB, stream=st)
    b.alloc(S2 + 3 * MiB, 17 * MiB, stream=st)
    b.free(S2)
    b.alloc(S2, 5 * MiB // 2, stream=st)
    b.mark("end")
    b.baseline({"label": "end", "device_type": "cuda", "seq": len(b.events), "segments": [
        {"device": 0, "address": S2, "total_size": 20 * MiB, "stream": 0, "is_large": True, "is_expandable": False,
         "pool": [0, 0], "blocks": [[3 * MiB, 5 * MiB // 2, True, True], [17 * MiB, 17 * MiB, True, True]]}]})
    cap = allocscope.load(b.write(b.path))
    an = analyse(cap)
    assert an.att.blocks_exact and an.replay.fidelity.exact
    r = build_report(cap, at="end", analysis=an)
    assert r["at"]["allocated_bytes"] == 20 * MiB and r["at"]["rounded_bytes"] == r["at"]["requested_bytes"]
    gap = {i["item"]: i["bytes"] for i in r["gap"]}
    assert gap["unsplit_remainder"] == MiB // 2 and gap["allocator_rounding"] == 0 and gap["cached_free"] == 0


def test_without_an_exact_replay_blocks_are_the_rounded_requests(tmp_path):
    cap = write_scenario(tmp_path, wrong=True)
    an = analyse(cap)
    assert not an.att.blocks_exact
    assert (an.att.block == an.att.rounded).all()
    r = build_report(cap, analysis=an)
    assert any("did not follow the recording exactly" in w for w in r["warnings"])
    assert {i["item"]: i["bytes"] for i in r["gap"]}["unsplit_remainder"] == 0
