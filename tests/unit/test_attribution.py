"""Attribution, theory and the waterfall on hand-built captures whose every
number is derived in the comments."""

import dataclasses
import json

import numpy as np
import pytest

import allocscope
from allocscope import EventKind as K
from allocscope.capture.writer import CaptureWriter
from allocscope.attribution import CATEGORIES, ConservationError, attribute, moment, timeline, waterfall
from allocscope.reports import build_report
from allocscope.reports.report import find_mark
from allocscope.allocator.sizes import round_sizes
from allocscope.attribution.estimate import theory

pytestmark = pytest.mark.torch_agnostic

MiB = 1 << 20
WATCH = {"name": "M", "parameters": 1000, "trainable": 1000, "buffers": 0, "parameter_count": 250,
         "optimizer": {"type": "SGD", "state_per_parameter": 1.0}}


def one_step(tmp_path):
    """One SGD-with-momentum step of a model M with one leaf M.fc."""
    b = CaptureWriter()
    b.annotate(K.WATCH, json.dumps(WATCH))
    b.annotate(K.PARAMETER, "M.fc.weight", 0x1000, 1000)  # built before recording
    b.alloc(0x9000, 400)  # the batch, made outside any phase
    b.annotate(K.PHASE, "forward", 0)
    b.annotate(K.INPUT, "M.input[0]", 0x9000, 400)
    b.annotate(K.MODULE_ENTER, "M", 0)
    b.annotate(K.MODULE_ENTER, "M.fc", 2)
    b.alloc(0x2000, 800)  # fc's output, saved for backward
    b.annotate(K.ACTIVATION, "M.fc", 0x2000, 800)
    b.alloc(0x3000, 300)  # an intermediate freed within forward
    b.free(0x3000)
    b.alloc(0x4000, 200)  # kept by the graph without a label: freed in backward
    b.annotate(K.MODULE_EXIT, "M.fc", 2, 800)
    b.annotate(K.MODULE_EXIT, "M", 0)
    b.alloc(0x5000, 50)  # the loss: never freed
    b.mark("after forward")
    b.annotate(K.PHASE, "backward", 0)
    b.annotate(K.MODULE_ENTER, "M.fc", 3)
    b.alloc(0x6000, 1000)  # the weight's gradient
    b.annotate(K.GRADIENT, "M.fc.weight", 0x6000, 1000)
    b.alloc(0x7000, 600)  # a gradient of an activation
    b.mark("in backward")
    b.free(0x7000)
    b.free(0x2000)
    b.free(0x4000)
    b.annotate(K.PHASE, "other", 0)
    b.annotate(K.PHASE, "optimizer", 0)
    b.alloc(0x8000, 1000)  # momentum buffer
    b.annotate(K.OPTIMIZER_STATE, "M.fc.weight/momentum_buffer", 0x8000, 1000)
    b.annotate(K.PHASE, "other", 1)
    b.mark("after step")
    return allocscope.load(b.write(tmp_path / "step.alsc"))


def row_at(att, addr):
    (r,) = np.flatnonzero(att.addr == addr)
    return r


def test_every_rule_gives_its_category(tmp_path):
    att = attribute(one_step(tmp_path))
    expect = {0x1000: "parameter", 0x9000: "input", 0x2000: "activation", 0x3000: "temporary",
              0x4000: "activation", 0x5000: "output", 0x6000: "gradient", 0x7000: "temporary",
              0x8000: "optimizer_state"}
    assert {a: CATEGORIES[att.category[row_at(att, a)]] for a in expect} == expect
    # the parameter predates recording: live from the start, never freed
    r = row_at(att, 0x1000)
    assert att.start[r] == -1 and att.end[r] == att.n_events and att.size[r] == 1000
    modules = {a: att.name(int(att.module[row_at(att, a)])) for a in (0x1000, 0x2000, 0x3000, 0x7000, 0x8000, 0x5000)}
    assert modules == {0x1000: "M.fc", 0x2000: "M.fc", 0x3000: "M.fc", 0x7000: "M.fc", 0x8000: "M.fc", 0x5000: ""}
    assert att.name(int(att.label[row_at(att, 0x8000)])) == "M.fc.weight/momentum_buffer"


def test_survivors_of_each_phase_have_a_category(tmp_path):
    """What outlives its phase without a label: forward results the loop
    keeps (the model's output, the loss) are outputs, what backward leaves
    (an input's gradient) is a gradient, what the optimizer leaves is
    optimizer state; outside phases, other. Nothing is unknown."""
    b = CaptureWriter()
    b.annotate(K.WATCH, json.dumps(WATCH))
    b.alloc(0x1000, 64)  # targets, made by the loop before forward
    b.annotate(K.PHASE, "forward", 0)
    b.alloc(0x2000, 128)  # the model's output, kept after backward
    b.alloc(0x3000, 4)  # the loss
    b.annotate(K.PHASE, "backward", 0)
    b.alloc(0x4000, 256)  # the input's gradient (x.requires_grad)
    b.alloc(0x5000, 8)  # freed within backward
    b.free(0x5000)
    b.annotate(K.PHASE, "optimizer", 0)
    b.alloc(0x6000, 16)  # a step counter nobody labelled
    b.annotate(K.PHASE, "other", 1)
    b.free(0x2000)  # dropped by the loop after the step
    b.free(0x3000)
    att = attribute(allocscope.load(b.write(tmp_path / "survivors.alsc")))
    got = {a: CATEGORIES[att.category[row_at(att, a)]] for a in (0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000)}
    assert got == {0x1000: "other", 0x2000: "output", 0x3000: "output", 0x4000: "gradient", 0x5000: "temporary",
                   0x6000: "optimizer_state"}


def test_theory_and_waterfall_at_the_peak(tmp_path):
    cap = one_step(tmp_path)
    r = build_report(cap)
    # live in backward: parameter 1000, input 400, activations 800 + 200,
    # loss 50, gradient 1000, temporary 600 = 4050 (the peak)
    assert r["peak"]["event"] == find_mark(cap, "in backward") - 1
    assert r["peak"]["requested_bytes"] == 4050
    # theory: 1000 parameters + 1000 gradients + 1000 momentum + 800 layer
    # outputs, twice + 400 input = 5000
    th = r["theory"]
    assert (th["parameters"], th["gradients"], th["optimizer_state"], th["activations"],
            th["activation_gradients"], th["inputs"], th["total"]) == (1000, 1000, 1000, 800, 800, 400, 5000)
    gap = {i["item"]: i["bytes"] for i in r["gap"]}
    assert gap == {"parameters": 0, "buffers": 0, "gradients": 0, "optimizer_state": -1000, "activations": 200,
                   "inputs": 0, "outputs": 50, "kv_cache": 0, "engine_buffers": 0, "temporaries": -200, "workspaces": 0, "other": 0, "unknown": 0,
                   "allocator_rounding": 0, "unsplit_remainder": 0}
    assert r["measured"] == {"allocated_bytes": 4050, "requested_bytes": 4050, "basis": "allocated",
                             "total_bytes": 4050}
    assert 5000 + sum(gap.values()) == 4050


def test_at_a_mark(tmp_path):
    cap = one_step(tmp_path)
    r = build_report(cap, at="after step")
    # parameter, input, loss, gradient (not zeroed) and momentum remain
    assert r["at"]["by_category"] | {} == {c: 0 for c in CATEGORIES} | {
        "parameter": 1000, "input": 400, "output": 50, "gradient": 1000, "optimizer_state": 1000}
    assert r["at"]["label"] == "after step"
    assert r["at"]["by_module"] == {"M.fc": 3000, "M": 400, "<no module>": 50}


def two_baselines(tmp_path, outside_at_start, outside_at_end):
    """A CUDA capture: one 2 MiB segment at the start, a 20 MiB one and a
    5,000,000 B request in it, then the end; device memory outside the
    allocator as given at each baseline."""
    seg, seg2 = 0x7F0000000000, 0x7F0000200000
    b = CaptureWriter({"devices_recorded": ["cuda"]}, device=0)

    def base(label, reserved, outside):
        return {"label": label, "device_type": "cuda", "seq": 0, "config": {"roundup_power2_divisions": []},
                "segments": [{"device": 0, "address": seg, "total_size": 2 * MiB, "stream": 0,
                              "blocks": [[512, 100, True, True], [2 * MiB - 512, 0, False, False]]}],
                "devices": [{"index": 0, "free": 0, "total": 0, "used": reserved + outside,
                             "stats": {"reserved_bytes": {"current": reserved, "peak": reserved}}}]}

    b.baseline(base("start", 2 * MiB, outside_at_start))
    b.event(K.SEGMENT_ALLOC, addr=seg2, size=20 * MiB)
    b.alloc(seg2, 5_000_000)
    b.free(seg2)
    b.baseline(base("end", 22 * MiB, outside_at_end))
    return b.write(tmp_path / "cuda.alsc")


def test_cuda_line_items_rounding_cache_and_outside(tmp_path):

    cap = allocscope.load(two_baselines(tmp_path, outside_at_start=300 * MiB, outside_at_end=300 * MiB))
    r = build_report(cap)
    # at the peak: the old 100 B request in a 512 B block, and 5,000,000 B
    # rounded up to 9766 x 512 = 5,000,192 B
    assert r["peak"]["requested_bytes"] == 5_000_100
    assert r["peak"]["allocated_bytes"] == 512 + 5_000_192
    assert r["peak"]["reserved_bytes"] == 22 * MiB
    gap = {i["item"]: i["bytes"] for i in r["gap"] if i["bytes"]}
    assert gap == {"other": 5_000_100, "allocator_rounding": 412 + 192,
                   "cached_free": 22 * MiB - (512 + 5_000_192), "outside_allocator": 300 * MiB}
    assert r["measured"]["total_bytes"] == 322 * MiB and r["measured"]["basis"] == "device_used"
    assert r["theory"]["total"] == 0 and r["peak_reserved"]["reserved_bytes"] == 22 * MiB
    assert "outside_allocator_at_start_bytes" not in r["measured"]


def test_memory_outside_the_allocator_that_grew_during_the_run_is_said(tmp_path):
    """On a GPU, kernels and library handles load on first use: the end
    reading is used, and the start reading is reported beside it."""
    cap = allocscope.load(two_baselines(tmp_path, outside_at_start=500 * MiB, outside_at_end=740 * MiB))
    r = build_report(cap)
    item = next(i for i in r["gap"] if i["item"] == "outside_allocator")
    assert item["bytes"] == 740 * MiB and r["measured"]["outside_allocator_at_start_bytes"] == 500 * MiB
    assert f"up to {240 * MiB} bytes less" in item["detail"]
    assert r["measured"]["total_bytes"] == 22 * MiB + 740 * MiB


def test_a_waterfall_that_does_not_add_up_is_refused(tmp_path):
    cap = one_step(tmp_path)
    att = attribute(cap)
    tl = timeline(att)
    e = find_mark(cap, "in backward")
    m = moment(att, e, tl)
    waterfall(att, m, theory(att, e), tl)  # consistent: no error
    lost = dataclasses.replace(m, by_category=m.by_category | {"output": 0})
    with pytest.raises(ConservationError, match="sums to"):
        waterfall(att, lost, theory(att, e), tl)


def test_labels_without_memory_are_reported_not_invented(tmp_path):
    b = CaptureWriter()
    b.alloc(0x1000, 64)
    b.free(0x1000)
    b.annotate(K.PARAMETER, "M.w", 0x1000, 64)  # that memory was freed: nothing to label
    b.annotate(K.PARAMETER, "M.v", 0x2000, 32)  # never seen: memory from before recording
    b.free(0x2000)  # ...freed while recording
    att = attribute(allocscope.load(b.write(tmp_path / "l.alsc")))
    assert any("1 tensor labels name no live allocation" in w for w in att.warnings)
    r = row_at(att, 0x2000)
    # live from the start until its FREE (event 4)
    assert (att.start[r], att.end[r], att.size[r], CATEGORIES[att.category[r]]) == (-1, 4, 32, "parameter")
    assert CATEGORIES[att.category[row_at(att, 0x1000)]] == "other"


def test_a_capture_without_watch_is_all_other(tmp_path):
    b = CaptureWriter()
    b.alloc(0x1000, 64)
    r = build_report(allocscope.load(b.write(tmp_path / "plain.alsc")))
    assert r["peak"]["by_category"]["other"] == 64 and r["theory"]["total"] == 0
    assert r["iterations"] == [] and "no model was watched" in r["theory"]["notes"][0]


@pytest.mark.parametrize("size, divisions, expected", [
    (1, [], 512),  # below 512: one minimum block
    (512, [], 512),
    (513, [], 1024),  # whole 512 B multiples
    (1_572_865, [], 1_573_376),  # 1.5 MiB + 1 -> next 512 B multiple
    (1_572_865, [4], 1_835_008),  # 4 divisions of [1, 2) MiB: steps of 256 KiB -> 1.75 MiB
    (2 * MiB, [0, 4], 2 * MiB),  # powers of two stay
    (2 * MiB + 1, [0, 4], 2 * MiB + 512 * 1024),  # bucket [2, 4) MiB, 4 divisions: steps of 512 KiB
    (1200, [4], 1536),  # 1200 <= 512 x 4: plain rounding even with divisions
])
def test_round_size(size, divisions, expected):
    assert int(round_sizes(np.array([size]), divisions)[0]) == expected


def test_an_allocation_sequenced_just_after_the_start_snapshot_is_one_row(tmp_path):
    """Another thread's allocation, completed in the caching allocator just
    before the baseline's snapshot and sequenced just after it: the
    baseline holds its block and its ALLOC comes first at that address
    (docs/format.md, BASELINE). One row, not two; a block the recording
    frees first stays memory from before recording."""
    seg = 0x7F0000000000
    b = CaptureWriter({"devices_recorded": ["cuda"]}, device=0)
    b.baseline({"label": "start", "device_type": "cuda", "seq": 0, "config": {"roundup_power2_divisions": []},
                "segments": [{"device": 0, "address": seg, "total_size": 2 * MiB, "stream": 0,
                              "blocks": [[1024, 1000, True, True], [1024, 600, True, True],
                                         [2 * MiB - 2048, 0, False, False]]}]})
    b.alloc(seg, 1000)  # the block at seg: this allocation, sequenced after the snapshot
    b.free(seg + 1024)  # older memory, freed
    b.alloc(seg + 1024, 700)
    cap = allocscope.load(b.write(tmp_path / "race.alsc"))
    att = attribute(cap)
    at_end = att.live(len(cap.events) - 1)
    live = sorted(zip(att.addr[at_end].tolist(), att.size[at_end].tolist(), strict=True))
    assert live == [(seg, 1000), (seg + 1024, 700)]
    assert att.rows == 3 and int(np.count_nonzero(att.start < 0)) == 1  # the older block at seg + 1024


def test_a_run_that_died_before_its_first_step_is_estimated_without_optimizer_state(tmp_path):
    # one_step's first backward, then an OOM there: the momentum buffer never existed
    b = CaptureWriter()
    b.annotate(K.WATCH, json.dumps(WATCH))
    b.annotate(K.PARAMETER, "M.fc.weight", 0x1000, 1000)
    b.annotate(K.PHASE, "forward", 0)
    b.alloc(0x2000, 800)
    b.annotate(K.PHASE, "backward", 0)
    b.alloc(0x6000, 1000)
    b.event(K.OOM, size=5000)
    cap = allocscope.load(b.write(tmp_path / "died.alsc"))
    att = attribute(cap)
    th = theory(att, 5)
    assert th["optimizer_state"] == 0 and th["parameters"] == 1000
    assert th["notes"][-1] == ("the run ran out of memory at event 6, before its first optimizer step: the estimate "
                               "is of what existed then, without optimizer state (1000 bytes by the textbook's rule, "
                               "never made)")
    # a run that stepped once before it died: the state counts, as for any moment
    b = CaptureWriter()
    b.annotate(K.WATCH, json.dumps(WATCH))
    b.annotate(K.PHASE, "forward", 0)
    b.alloc(0x2000, 800)
    b.annotate(K.PHASE, "backward", 0)
    b.annotate(K.PHASE, "optimizer", 0)
    b.alloc(0x8000, 1000)
    b.annotate(K.PHASE, "forward", 1)
    b.event(K.OOM, size=5000)
    later = theory(attribute(allocscope.load(b.write(tmp_path / "later.alsc"))), 5)
    assert later["optimizer_state"] == 1000 and not any("ran out" in n for n in later["notes"])


def test_a_run_that_caught_its_oom_and_stepped_later_keeps_optimizer_state(tmp_path):
    # (a benchmark that retries at a smaller batch: the first try ran out before any step, the second stepped)
    b = CaptureWriter()
    b.annotate(K.WATCH, json.dumps({**WATCH, "id": 1}))
    b.annotate(K.PHASE, "forward", 0)
    b.event(K.OOM, size=5000)
    b.annotate(K.PHASE, "forward", 0)
    b.annotate(K.PHASE, "backward", 0)
    b.alloc(0x2000, 800)
    b.annotate(K.PHASE, "optimizer", 0)
    cap = allocscope.load(b.write(tmp_path / "retried.alsc"))
    th = theory(attribute(cap), 5)
    assert th["optimizer_state"] == 1000 and not any("ran out" in n for n in th["notes"])


def test_the_estimate_counts_the_models_alive_at_its_moment(tmp_path):
    # A model watched, dropped (its watch says gone), rebuilt under the same
    # name (a new watch), whose optimizer auto-watch finds at its first step.
    first = {**WATCH, "id": 1, "optimizer": None}
    second = {**WATCH, "id": 2, "optimizer": None, "parameters": 3000, "trainable": 3000}
    b = CaptureWriter()
    b.annotate(K.WATCH, json.dumps(first))  # 0
    b.annotate(K.PHASE, "forward", 0)  # 1
    b.event(K.OOM, size=5000)  # 2
    b.annotate(K.WATCH, json.dumps({"id": 1, "name": "M", "update": True, "gone": True}))  # 3
    b.annotate(K.WATCH, json.dumps(second))  # 4
    b.annotate(K.PHASE, "forward", 0)  # 5
    b.annotate(K.PHASE, "backward", 0)  # 6
    b.annotate(K.PHASE, "optimizer", 0)  # 7
    b.annotate(K.WATCH, json.dumps({"id": 2, "name": "M", "update": True,  # 8
                                    "optimizer": {"type": "Adam", "state_per_parameter": 2.0}}))
    b.annotate(K.WATCH, json.dumps({"id": 2, "name": "M", "update": True, "optimizer": None}))  # 9: freed
    b.annotate(K.PHASE, "forward", 1)  # 10
    att = attribute(allocscope.load(b.write(tmp_path / "rebuilt.alsc")))
    assert [w["id"] for w in att.watches] == [1, 2] and att.watches[0]["gone"] is True
    assert theory(att, 2)["parameters"] == 1000  # the first model alone
    at_step = theory(att, 6)  # the second alone, with the optimizer found after this moment
    assert at_step["parameters"] == 3000 and at_step["optimizer_state"] == 6000 and at_step["optimizers"] == ["Adam"]
    assert theory(att, 10)["optimizer_state"] == 0  # its optimizer was freed
    assert [w["id"] for w in att.watches_at(3)] == []  # between the two
    assert any("no watched model was alive" in n for n in theory(att, 3)["notes"])
