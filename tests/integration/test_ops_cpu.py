"""The op behind each allocation (format 2's op column), held to
torch.profiler's record of the same allocations, and the forward stack that
backward allocations inherit, on CPU."""

import json

import numpy as np
import pytest
import torch
from torch import nn

import allocscope
from allocscope import EventKind
from allocscope.common.errors import InputError
from allocscope.attribution import CATEGORIES, attribute
from allocscope.attribution.timeline import site_labels
from allocscope.reports import build_report
from allocscope.reports.report import render

from .layered_model import LINES, Layered


class Step(nn.Module):
    """Linear, conv, layer norm and attention: the ops of the issue's list."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.proj = nn.Linear(8 * 8, 32)
        self.norm = nn.LayerNorm(32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        h = self.conv(x).flatten(2)  # (batch, 8 channels, 64)
        h = self.norm(self.proj(h))
        return self.attn(h, h, h, need_weights=False)[0]


def profiled_step(tmp_path):
    """One training step recorded by allocscope and profiled by torch at
    once: (capture, [(addr, bytes, innermost op) of each CPU allocation the
    profiler saw])."""
    torch.manual_seed(0)
    model = Step()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(4, 3, 8, 8)
    model(x).sum().backward()  # warm up: lazily made state is not the step's
    opt.step()
    opt.zero_grad()
    trace = tmp_path / "trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        with allocscope.record(tmp_path / "step.alsc", device="cpu", ops=True):
            model(x).square().mean().backward()
            opt.step()
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    seen = []
    for m in events:
        if m.get("name") != "[memory]" or m["args"].get("Bytes", 0) <= 0 or m["args"].get("Device Type") != 0:
            continue
        inside = [o for o in ops if o["tid"] == m["tid"] and o["ts"] <= m["ts"] <= o["ts"] + o["dur"]]
        # the innermost: the latest to start (ties: the shortest)
        inner = max(inside, key=lambda o: (o["ts"], -o["dur"]))["name"] if inside else None
        seen.append((int(m["args"]["Addr"]), int(m["args"]["Bytes"]), inner))
    return allocscope.load(tmp_path / "step.alsc"), seen


def shown(name):
    return name.removeprefix("autograd::engine::evaluate_function: ") if name else None


def test_each_allocation_names_the_op_the_profiler_saw_make_it(tmp_path):
    cap, seen = profiled_step(tmp_path)
    ev = cap.events
    allocs = np.flatnonzero(ev.kind == EventKind.ALLOC)
    # chains innermost first, as Capture.stack gives frames
    ours = [(int(ev.addr[i]), int(ev.size[i]), [f.function for f in cap.stack(int(ev.op[i]))]) for i in allocs]
    assert len(ours) > 50
    # The same allocations, paired by address and size in order (the
    # profiler misses some: those its own thread-local state does not see).
    queue = {}
    for a, b, inner in seen:
        queue.setdefault((a, b), []).append(inner)
    paired = named = 0
    for a, b, chain in ours:
        if not queue.get((a, b)):
            continue
        inner = shown(queue[(a, b)].pop(0))
        paired += 1
        if inner is None:
            assert chain == [], chain  # outside any op: Python scalars wrapped into tensors
            continue
        named += 1
        # our innermost op is the profiler's (the engine's frame around a
        # node and the node itself share a name, shown once)
        assert chain and chain[0] == inner, (chain, inner)
    assert paired > 0.9 * len(ours) and named > 0.5 * paired, (paired, named, len(ours))
    names = {f for _, _, chain in ours for f in chain}
    for op in ("aten::conv2d", "aten::linear", "aten::layer_norm", "aten::_foreach_sqrt", "AddmmBackward0",
               "ConvolutionBackward0", "NativeLayerNormBackward0"):
        assert op in names or op.replace("_foreach_", "") in names, op


def test_backward_allocations_carry_the_forward_line_of_their_node(tmp_path):
    torch.manual_seed(0)
    model = Layered()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with allocscope.record(tmp_path / "b.alsc", device="cpu") as rec:
        rec.watch(model, opt)
        for _ in range(2):
            model(torch.randn(16, 32)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    check_backward_lines(allocscope.load(tmp_path / "b.alsc"))


def check_backward_lines(cap):
    """Every allocation made in an autograd node points to the line of the
    layer whose forward made the node; every gradient to its layer's line."""
    att = attribute(cap)
    rows = np.flatnonzero(att.start >= 0)
    code, labels = site_labels(att, rows)
    backward = 0
    for r, c in zip(rows.tolist(), code.tolist(), strict=True):
        chain = cap.stack(int(att.op[r]))
        node = next((f.function for f in reversed(chain) if f.filename == "<autograd>"), None)
        if node is None:
            continue
        backward += 1
        frames = cap.stack(int(att.stack[r]))
        lines = {f.line for f in frames if f.filename.endswith("layered_model.py")}
        expected = {"AddmmBackward0": {LINES["fc1"], LINES["fc2"]}, "TBackward0": {LINES["fc1"], LINES["fc2"]},
                    "ReluBackward0": {LINES["relu"]}, "NativeLayerNormBackward0": {LINES["norm"]}}.get(node)
        if expected is not None:
            assert lines & expected, (node, labels[c])
        assert f"[backward: {node}]" in labels[c]
    assert backward > 0
    gradients = np.flatnonzero((att.category == CATEGORIES.index("gradient")) & (att.label >= 0) & (att.start >= 0))
    assert len(gradients) >= 4
    for r in gradients.tolist():
        label = att.names[att.label[r]]  # Layered.fc1.weight
        frames = cap.stack(int(att.stack[r]))
        assert LINES[label.split(".")[1]] in {f.line for f in frames if f.filename.endswith("layered_model.py")}, label
    report = build_report(cap)
    assert all("<no stack>" not in s["site"] for s in report["sites"])
    assert all("<no stack>" not in g["site"] for g in report["peak"]["top"])


def trained_parameters(device, path=None, ops=True):
    """Two watched Adam steps of Step on `device`, recorded into `path`
    (None: not recorded); the parameters after them."""
    import contextlib

    torch.manual_seed(0)
    model = Step().to(device)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(4, 3, 8, 8, device=device)
    recording = allocscope.record(path, device=device, ops=ops) if path else contextlib.nullcontext()
    with recording as rec:
        if rec is not None:
            rec.watch(model, opt)
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


def test_recording_ops_changes_no_result_and_can_be_left_out(tmp_path):
    plain = trained_parameters("cpu")
    assert all(torch.equal(a, b) for a, b in zip(plain, trained_parameters("cpu", tmp_path / "r.alsc"), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(plain, trained_parameters("cpu", tmp_path / "r.alsc", ops=False),
                                                 strict=True))
    cap = allocscope.load(tmp_path / "r.alsc")
    assert cap.metadata["ops"] is False and not cap.events.op.any()


def test_by_default_ops_are_recorded_from_the_first_watch_on(tmp_path):
    """record()'s default (ops=None): no op callback while nothing is watched
    (it costs on every op), and from the first watch() on, ops as ops=True
    records them: watched models' backward scopes come from them."""
    from allocscope.common.native import native

    C = native()

    def recorded(path, ops):
        torch.manual_seed(0)
        model = Step()
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(4, 3, 8, 8)
        with allocscope.record(path, device="cpu", ops=ops) as rec:
            model(x).sum().backward()
            assert C.ops_active() == (ops is True)
            allocscope.mark("watch")
            rec.watch(model, opt)
            assert C.ops_active()
            for _ in range(2):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
        cap = allocscope.load(path)
        ev = cap.events
        (at,) = np.flatnonzero(ev.kind == EventKind.MARK)
        # (on the program's thread: which of the intra-op pool's threads, which run no op
        # callbacks, makes an allocation inside a parallel kernel varies from run to run)
        allocs = np.flatnonzero((ev.kind == EventKind.ALLOC) & (ev.thread == ev.thread[at]))
        chains = [tuple(f.function for f in cap.stack(int(ev.op[i]))) for i in allocs]
        scopes = [(int(ev.addr[i]), cap.strings[int(ev.arg[i])]) for i in np.flatnonzero(
            (ev.kind == EventKind.MODULE_ENTER) | (ev.kind == EventKind.MODULE_EXIT))]
        return cap, chains, allocs > at, scopes

    cap, chains, after, scopes = recorded(tmp_path / "d.alsc", None)
    assert cap.metadata["ops"] == "watch"
    assert not after.all() and not any(c for c, a in zip(chains, after, strict=True) if not a)
    assert any("aten::addmm" in c for c in chains)
    whole, whole_chains, whole_after, whole_scopes = recorded(tmp_path / "o.alsc", True)
    assert whole.metadata["ops"] is True
    assert [c for c, a in zip(chains, after, strict=True) if a] == \
        [c for c, a in zip(whole_chains, whole_after, strict=True) if a]
    assert scopes == whole_scopes and any(addr & 1 for addr, _ in scopes)  # backward scopes, from the op recorder
    assert not C.ops_active() and not C.start_ops()  # nothing to start outside a recording
    with allocscope.record(tmp_path / "n.alsc", device="cpu"):
        Step()(torch.randn(4, 3, 8, 8)).sum().backward()
    cap = allocscope.load(tmp_path / "n.alsc")
    assert cap.metadata["ops"] == "watch" and not cap.events.op.any()
    assert "Top ops: none recorded" in render(build_report(cap))  # and says how to record them
    with pytest.raises(InputError, match="ops must be"):
        allocscope.record(tmp_path / "x.alsc", device="cpu", ops="yes")
