"""The op column (format 2) on synthetic captures: what the writer puts in
comes out, format 1 files still load, and the reports name ops as
attribution.ops says."""

import pytest

import allocscope
from allocscope.capture import format as F
from allocscope.attribution import attribute
from allocscope.attribution.ops import NO_OP, op_names
from allocscope.reports import build_report
from allocscope.reports.events import event_rows, render_event
from allocscope.reports.report import render
from allocscope.reports.views import stack_tree
from allocscope.capture.writer import CaptureWriter

from .test_attribution import two_baselines

pytestmark = pytest.mark.torch_agnostic


def ops(b, *names):
    """An op chain given outermost first (node names end in Backward0)."""
    return b.stack([("<autograd>" if n.endswith("Backward0") else "<aten>", n, 0) for n in reversed(names)])


def training_like(tmp_path, version=F.FORMAT_VERSION):
    b = CaptureWriter()
    fwd = b.stack([("model.py", "forward", 47), ("train.py", "main", 10)])
    b.alloc(0x1000, 4096, stack=fwd, op=ops(b, "aten::linear", "aten::addmm"))
    b.alloc(0x3000, 512, stack=fwd, op=ops(b, "aten::layer_norm", "aten::native_layer_norm", "aten::empty"))
    # backward: the forward op's stack, the node's ops
    b.alloc(0x5000, 4096, stack=fwd, op=ops(b, "AddmmBackward0", "aten::mm"))
    b.alloc(0x7000, 64, stack=b.stack([("train.py", "main", 12)]))  # outside any op
    return allocscope.load(b.write(tmp_path / "ops.alsc", version=version))


def test_the_op_column_round_trips(tmp_path):
    cap = training_like(tmp_path)
    assert cap.version == 2
    chains = [[f.function for f in cap.stack(int(o))] for o in cap.events.op]
    assert chains == [["aten::addmm", "aten::linear"], ["aten::empty", "aten::native_layer_norm", "aten::layer_norm"],
                      ["aten::mm", "AddmmBackward0"], []]
    rows = list(event_rows(cap, kinds=("alloc",)))  # allocscope dump
    assert rows[0]["ops"] == ["aten::linear", "aten::addmm"] and "ops" not in rows[3]
    assert "op=AddmmBackward0 > aten::mm" in render_event(rows[2])


def test_format_1_files_load_without_ops(tmp_path):
    cap = training_like(tmp_path, version=1)
    assert cap.version == 1 and len(cap.events) == 4
    assert not cap.events.op.any()
    assert cap.events.size.tolist() == [4096, 512, 4096, 64]
    r = build_report(cap)
    assert [o["op"] for o in r["ops"]] == [NO_OP] and "Top ops" not in render(r)


def test_an_op_naming_an_undefined_stack_is_refused(tmp_path):
    b = CaptureWriter()
    b.alloc(0x1000, 16, op=7)
    with pytest.raises(allocscope.CorruptCaptureError, match="stack not yet defined"):
        allocscope.load(b.write(tmp_path / "bad.alsc"))


def test_reports_group_by_op_and_name_backward_sites(tmp_path):
    cap = training_like(tmp_path)
    names = {n.name for n in op_names(cap, cap.events.op).values()}
    # the inner op where it says more; plain allocation ops are not named
    assert names == {"aten::linear > aten::addmm", "aten::layer_norm > aten::native_layer_norm",
                     "AddmmBackward0 > aten::mm", NO_OP}
    r = build_report(cap)
    assert {o["op"]: o["allocated_bytes"] for o in r["ops"]} == {
        "aten::linear > aten::addmm": 4096, "AddmmBackward0 > aten::mm": 4096,
        "aten::layer_norm > aten::native_layer_norm": 512, NO_OP: 64}
    assert r["peak"]["by_op"]["AddmmBackward0 > aten::mm"] == 4096
    sites = {s["site"]: s["allocated_bytes"] for s in r["sites"]}
    assert sites == {"model.py:47 (forward)": 4608, "model.py:47 (forward) [backward: AddmmBackward0]": 4096,
                     "train.py:12 (main)": 64}
    assert "Top ops" in render(r)
    tree = stack_tree(attribute(cap), len(cap.events) - 1)

    def paths(node, prefix=()):  # [name id, bytes, category, children]
        here = prefix + (tree["names"][node[0]],)
        return [p for k in node[3] for p in paths(k, here)] if node[3] else [here]

    assert any(p[-3:] == ("AddmmBackward0", "aten::mm", "other") and "forward (model.py:47)" in p
               for p in paths(tree["root"]))


def test_memory_from_before_recording_is_named_so(tmp_path):
    cap = allocscope.load(two_baselines(tmp_path, outside_at_start=0, outside_at_end=0))
    r = build_report(cap)
    older = [g for g in r["peak"]["top"] if g["site"] == "<before recording>"]
    assert [g["bytes"] for g in older] == [100]  # the start baseline's live block


def _paths(tree):
    def walk(node, prefix=()):  # [name id, bytes, category, children]
        here = prefix + (tree["names"][node[0]],)
        return [p for k in node[3] for p in walk(k, here)] if node[3] else [here]
    return walk(tree["root"])


def test_the_stack_tree_folds_library_frames_on_request(tmp_path):
    b = CaptureWriter()
    torch_py = "/venv/lib/python3.11/site-packages/torch/nn/modules/"
    # innermost first: a torch run of three frames under the user's model, under a torch run of two under main
    stack = b.stack([(torch_py + "linear.py", "Linear.forward", 134), (torch_py + "module.py", "Module._call_impl", 1794),
                     (torch_py + "module.py", "Module._wrapped_call_impl", 1783), ("model.py", "Net.forward", 20),
                     (torch_py + "module.py", "Module._call_impl", 1794),
                     (torch_py + "module.py", "Module._wrapped_call_impl", 1783), ("train.py", "main", 10)])
    lone = b.stack([(torch_py + "functional.py", "relu", 5), ("train.py", "main", 11)])
    b.alloc(0x1000, 4096, stack=stack)
    b.alloc(0x3000, 512, stack=lone)
    cap = allocscope.load(b.write(tmp_path / "lib.alsc"))
    att, last = attribute(cap), len(cap.events) - 1
    full = _paths(stack_tree(att, last))
    folded = _paths(stack_tree(att, last, fold_library=True))
    assert len(full[0]) == 1 + 7 + 1 and f"Module._call_impl ({torch_py}module.py:1794)" in full[0]
    assert sorted(folded) == sorted([
        ("all", "main (train.py:10)", "Module._call_impl [+1 library frame]", "Net.forward (model.py:20)",
         "Linear.forward [+2 library frames]", "other"),
        ("all", "main (train.py:11)", f"relu ({torch_py}functional.py:5)", "other"),  # a single frame stays
    ])


def test_the_timeline_starts_at_the_first_allocation_not_at_the_start_of_recording(tmp_path):
    from allocscope.attribution.timeline import timeline
    from allocscope.reports.views import timeline_view

    b = CaptureWriter({"start_monotonic_ns": 1_000_000})
    b.mark("imports done", dt=5_000_000_000)  # 5 s of set-up with nothing to draw
    first = b.alloc(0x1000, 4096, dt=1_000)
    b.alloc(0x3000, 512, dt=2_000_000)
    b.free(0x1000, 4096, dt=1_000_000)
    cap = allocscope.load(b.write(tmp_path / "late.alsc"))
    att = attribute(cap)
    view = timeline_view(att, timeline(att), points=100)
    t_first = int(cap.events.time_ns[first]) - 1_000_000
    assert t_first > 5_000_000_000
    assert view["time_ns"][0] == t_first == min(view["time_ns"])  # the axis' left end
    assert view["allocated"][0] == 0 and max(view["allocated"]) == 4608
    assert view["time_ns"][-1] == int(cap.events.time_ns[-1]) - 1_000_000  # later times as they were
