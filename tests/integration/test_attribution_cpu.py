"""Attribution on real CPU training loops whose answers are exact: at a mark
after the optimizer step, each category holds exactly the tensors that
PyTorch says it should."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import allocscope
from allocscope.attribution import attribute, moment
from allocscope.attribution.categories import CATEGORIES
from allocscope.reports import build_report
from allocscope.reports.report import find_mark


def storage_bytes(tensors):
    """Bytes of the distinct storages behind tensors."""
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class RecurrentNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(12, 24, num_layers=2, batch_first=True)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class AttentionNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.block = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 50, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):
        return self.head(self.block(self.embed(tokens)))


class CheckpointedNet(nn.Module):
    """Blocks recomputed in backward (activation checkpointing); reentrant:
    the old way, a second backward inside the checkpoint's node."""

    def __init__(self, reentrant=False):
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(20, 48), nn.GELU(), nn.Linear(48, 20), nn.LayerNorm(20))
                                    for _ in range(3))
        self.head = nn.Linear(20, 5)

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=self.reentrant)
        return self.head(x)


MODELS = {
    "conv": (ConvNet, lambda: torch.randn(4, 3, 16, 16)),
    "recurrent": (RecurrentNet, lambda: torch.randn(4, 7, 12)),
    "attention": (AttentionNet, lambda: torch.randint(0, 50, (4, 9))),
    "checkpointed": (CheckpointedNet, lambda: torch.randn(6, 20)),
}


def train(path, make_model, make_input, optimizer="adam", steps=3):
    torch.manual_seed(0)
    model = make_model()  # built before recording: counted from its labels
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    expected = {}
    with allocscope.record(path, device="cpu") as rec:
        rec.watch(model, opt)
        for step in range(steps):
            x = make_input()
            out = model(x)
            loss = out.float().square().mean()
            allocscope.mark(f"forward {step}")
            loss.backward()
            opt.step()
            allocscope.mark(f"step {step}")
            if step == steps - 1:
                expected = {
                    "parameter": storage_bytes(model.parameters()),
                    "buffer": storage_bytes(model.buffers()),
                    "gradient": storage_bytes(p.grad for p in model.parameters() if p.grad is not None),
                    "optimizer_state": storage_bytes(v for s in opt.state.values() for v in s.values()
                                                     if isinstance(v, torch.Tensor)),
                    "input": storage_bytes([x]),
                }
            opt.zero_grad()
    return model, expected


@pytest.mark.parametrize("name", sorted(MODELS))
def test_categories_are_exact_after_the_optimizer_step(tmp_path, name):
    make_model, make_input = MODELS[name]
    path = tmp_path / f"{name}.alsc"
    model, expected = train(path, make_model, make_input)
    cap = allocscope.load(path)
    att = attribute(cap)
    m = moment(att, find_mark(cap, "step 2"))
    for category, nbytes in expected.items():
        assert m.by_category[category] == nbytes, category
    assert sum(m.by_category.values()) == m.requested_bytes
    # Adam: two moments per parameter plus a step counter each
    n_params = len(list(model.parameters()))
    assert expected["optimizer_state"] == 2 * expected["parameter"] + 4 * n_params
    # every byte of every parameter is attributed to the module that owns it
    owners = {f"{type(model).__name__}.{fqn.rsplit('.', 1)[0]}" for fqn, _ in model.named_parameters()}
    param_modules = {att.name(int(att.module[r])) for r in range(att.rows)
                     if att.category[r] == 0 and att.live(find_mark(cap, "step 2"))[r]}
    assert param_modules <= owners


def test_sgd_with_momentum_keeps_one_buffer_per_parameter(tmp_path):
    path = tmp_path / "sgd.alsc"
    model, expected = train(path, *MODELS["conv"], optimizer="sgd")
    cap = allocscope.load(path)
    m = moment(attribute(cap), find_mark(cap, "step 2"))
    assert m.by_category["optimizer_state"] == expected["optimizer_state"] == expected["parameter"]
    report = build_report(cap)
    assert report["theory"]["optimizer_state"] == expected["parameter"]


def test_tied_weights_are_counted_once(tmp_path):
    path = tmp_path / "tied.alsc"
    model, expected = train(path, *MODELS["attention"])
    untied = sum(p.numel() * p.element_size() for _, p in model.named_parameters(remove_duplicate=False))
    assert expected["parameter"] < untied  # the model really shares storage
    report = build_report(allocscope.load(path), at="step 2")
    assert report["at"]["by_category"]["parameter"] == expected["parameter"]
    assert report["theory"]["parameters"] == expected["parameter"]


def forward_activation(tmp_path, use_checkpoint):
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Tanh())
                           for _ in range(4))

    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False) if use_checkpoint else b(x)
            return x

    model = Deep()
    path = tmp_path / f"ckpt{int(use_checkpoint)}.alsc"
    with allocscope.record(path, device="cpu") as rec:
        rec.watch(model)
        loss = model(torch.randn(32, 64)).sum()
        allocscope.mark("after forward")
        loss.backward()
    cap = allocscope.load(path)
    return moment(attribute(cap), find_mark(cap, "after forward")).by_category["activation"]


def test_checkpointing_saves_fewer_activations(tmp_path):
    plain = forward_activation(tmp_path, False)
    ckpt = forward_activation(tmp_path, True)
    assert plain > 0 and ckpt > 0
    # Plain keeps every block's hidden (32x256) activations; checkpointing only
    # the blocks' inputs (32x64 each).
    assert ckpt < plain / 4
    assert plain >= 4 * 32 * 256 * 4


def test_the_waterfall_adds_up_on_every_capture(tmp_path):
    for name, (make_model, make_input) in MODELS.items():
        path = tmp_path / f"{name}.alsc"
        train(path, make_model, make_input, steps=2)
        cap = allocscope.load(path)
        for at in (None, "forward 0", "step 1"):
            r = build_report(cap, at=at)
            assert r["theory"]["total"] + sum(i["bytes"] for i in r["gap"]) == r["measured"]["total_bytes"]
            focus = r["at"] if at else r["peak"]
            assert sum(focus["by_category"].values()) == focus["requested_bytes"]
            assert sum(focus["by_module"].values()) == focus["requested_bytes"]


def test_phases_modules_and_iterations(tmp_path):
    path = tmp_path / "conv.alsc"
    train(path, *MODELS["conv"])
    cap = allocscope.load(path)
    att = attribute(cap)
    assert [p for p in att.phase_names if p != "other"][:3] == ["forward", "backward", "optimizer"]
    names = set(att.names)
    assert {"ConvNet.features.0", "ConvNet.head"} <= names
    # saved activations name the leaf module that was running
    act_modules = {att.name(int(att.module[r])) for r in range(att.rows) if att.category[r] == 4}
    assert "ConvNet.features.0" in act_modules or "ConvNet.features.2" in act_modules
    report = build_report(cap)
    its = report["iterations"]
    assert [i["iteration"] for i in its] == [0, 1, 2, 3]
    assert all(i["peak_allocated_bytes"] > 0 for i in its[:3])
    assert all(i["leaked_bytes"] == 0 for i in its)
    # The textbook estimate is computed from the watched model
    th = report["theory"]
    assert th["parameters"] == sum(p.numel() * 4 for p in ConvNet().parameters())
    assert th["gradients"] == th["parameters"] and th["optimizer_state"] == 2 * th["parameters"]
    assert th["activations"] > 0 and th["activation_gradients"] == th["activations"]
    assert th["inputs"] == 4 * 3 * 16 * 16 * 4


def test_modules_are_named_with_their_class(tmp_path):
    from allocscope.attribution import module_label
    from allocscope.attribution.timeline import timeline
    from allocscope.reports.report import render
    from allocscope.reports.views import module_tree, timeline_view

    path = tmp_path / "conv.alsc"
    train(path, *MODELS["conv"])
    cap = allocscope.load(path)
    att = attribute(cap)
    classes = att.module_classes
    assert classes["ConvNet"] == "ConvNet" and classes["ConvNet.head"] == "Linear"
    assert classes["ConvNet.features"] == "Sequential" and classes["ConvNet.features.0"] == "Conv2d"
    assert module_label("ConvNet.features.0", classes) == "ConvNet.features.0 (Conv2d)"
    assert module_label("ConvNet", classes) == "ConvNet"  # the name says it already
    assert module_label("<no module>", classes) == "<no module>"
    r = build_report(cap)
    assert r["module_classes"] and all(classes[m] == c for m, c in r["module_classes"].items())
    assert set(r["peak"]["by_module"]) & set(r["module_classes"])  # JSON keys stay the names
    text = render(r)
    named = [m for m in r["peak"]["by_module"] if m in classes and m != "ConvNet"]
    assert named and all(f"{m} ({classes[m]})" in text for m in named[:5])
    tree = module_tree(att, int(r["peak"]["event"]))
    assert {"features (Sequential)", "head (Linear)"} & set(tree["names"])
    assert any(k.endswith(")") for k in timeline_view(att, timeline(att))["by_module"])


def _train_conv(path, *, auto: bool, explicit_late: bool = False):
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with allocscope.record(path, device="cpu") as rec:
        if auto:
            rec.auto_watch()
        else:
            rec.watch(model, opt)
        for step in range(3):
            model(torch.randn(4, 3, 16, 16)).square().mean().backward()
            opt.step()
            if explicit_late and step == 0:
                assert rec.watch(model, opt) is rec.watch(model)  # the auto watch, not a second one
            opt.zero_grad()
            allocscope.mark(f"step {step}")


@pytest.mark.parametrize("explicit_late", [False, True])
def test_auto_watch_names_memory_as_an_explicit_watch_does(tmp_path, explicit_late):
    _train_conv(tmp_path / "explicit.alsc", auto=False)
    _train_conv(tmp_path / "auto.alsc", auto=True, explicit_late=explicit_late)
    explicit, auto = (allocscope.load(tmp_path / f"{n}.alsc") for n in ("explicit", "auto"))
    a_att = attribute(auto)
    assert [w["name"] for w in a_att.watches] == ["ConvNet"]  # one watch: the optimizer amended it
    assert a_att.watches[0]["optimizer"]["type"] == "Adam" and a_att.watches[0]["classes"]["ConvNet.head"] == "Linear"
    # From the second step on, every byte has the same meaning as under an explicit watch.
    for label in ("step 1", "step 2"):
        e, a = (moment(attribute(c), find_mark(c, label)) for c in (explicit, auto))
        assert a.by_category == e.by_category and a.by_module == e.by_module, label
    r = build_report(auto)
    assert r["theory"] == build_report(explicit)["theory"]  # the optimizer's state counted once


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                                    for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)  # recomputed in backward, outside Blocks' call
        return x


class Wrapper(nn.Module):  # holds a model, as torch.compile's OptimizedModule does
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def _blocks_run(path, mode):
    torch.manual_seed(0)
    model = Blocks()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Wrapper(model) if mode == "explicit_then_wrapped" else model
    with allocscope.record(path, device="cpu") as rec:
        if mode != "none":
            rec.auto_watch()
        if mode.startswith("explicit"):
            rec.watch(model, opt)
        for _ in range(2):
            run(torch.randn(512, 256)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return attribute(allocscope.load(path))


def _recorded_peak(cap) -> int:
    """The peak of what the program allocated while recording, from the ALLOC and FREE events alone."""
    live, now, peak = {}, 0, 0
    for kind, addr, size in zip(cap.events.kind.tolist(), cap.events.addr.tolist(), cap.events.size.tolist()):
        if kind == allocscope.EventKind.ALLOC:
            live[addr] = size
            now += size
            peak = max(peak, now)
        elif kind == allocscope.EventKind.FREE:
            now -= live.pop(addr, 0)
    return peak


def test_auto_watch_leaves_checkpointing_and_wrapped_models_alone(tmp_path):
    peaks = {}
    for mode in ("none", "auto", "explicit", "explicit_then_wrapped"):
        att = _blocks_run(tmp_path / f"{mode}.alsc", mode)
        # one watch: not the blocks recomputed in backward, not the wrapper around the watched model
        assert [w["name"] for w in att.watches] == ([] if mode == "none" else ["Blocks"]), mode
        peaks[mode] = _recorded_peak(att.capture)
    # What the program allocates is the same watched or not: checkpointing still frees what it recomputes.
    assert len(set(peaks.values())) == 1, peaks


def test_a_leak_across_iterations_is_found(tmp_path):
    model = nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    path = tmp_path / "leak.alsc"
    with allocscope.record(path, device="cpu") as rec:
        rec.watch(model, opt)
        for _ in range(4):
            loss = model(torch.randn(16, 32)).square().mean()
            kept.append(torch.zeros(1000))  # 4000 B leaked per step
            loss.backward()
            opt.step()
            opt.zero_grad()
    its = build_report(allocscope.load(path))["iterations"]
    # iteration 3 is the last complete one (what it keeps could be the
    # script's variables) and 4 the tail after the last step: not judged
    assert [i["leaked_bytes"] for i in its] == [4000, 4000, 4000, 0, 0]
    # the last complete iteration also retains its `loss` (4 B), still referenced
    assert [i["retained_bytes"] for i in its[:4]] == [4000, 4000, 4000, 4004]


def test_watching_does_not_change_results_and_is_removed(tmp_path):
    def run(watch):
        torch.manual_seed(0)
        model, make_input = MODELS["conv"][0](), MODELS["conv"][1]
        opt = torch.optim.Adam(model.parameters())
        with allocscope.record(tmp_path / "t.alsc", device="cpu") as rec:
            if watch:
                rec.watch(model, opt)
            for _ in range(2):
                loss = model(make_input()).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
        return model, [p.detach().clone() for p in model.parameters()]

    backward, grad = torch.autograd.backward, torch.autograd.grad
    plain_model, plain = run(False)
    watched_model, watched = run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert torch.autograd.backward is backward and torch.autograd.grad is grad
    for m in watched_model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    assert all(not p._post_accumulate_grad_hooks for p in watched_model.parameters())


def test_watch_without_a_recording_does_nothing():
    assert allocscope.watch(nn.Linear(2, 2)) is None
    with pytest.raises(allocscope.AllocscopeError, match="not running"):
        allocscope.Recording("x.alsc", device="cpu").watch(nn.Linear(2, 2))


def test_watch_rejects_what_is_not_a_module(tmp_path):
    with allocscope.record(tmp_path / "t.alsc", device="cpu") as rec:
        with pytest.raises(TypeError, match="torch.nn.Module"):
            rec.watch(lambda x: x)


def test_report_cli_text_and_json(tmp_path):
    import json
    import subprocess
    import sys

    path = tmp_path / "conv.alsc"
    train(path, *MODELS["conv"], steps=2)
    text = subprocess.run([sys.executable, "-m", "allocscope", "report", str(path)],
                          capture_output=True, text=True, check=True).stdout
    assert "Theory vs practice" in text and "= measured" in text and "ConvNet.head" in text
    js = json.loads(subprocess.run([sys.executable, "-m", "allocscope", "report", "--json", "--at", "step 1",
                                    str(path)], capture_output=True, text=True, check=True).stdout)
    assert js["schema"] == "allocscope.report/1"
    assert set(js["at"]) >= {"allocated_bytes", "reserved_bytes", "time_ns", "by_category", "by_module"}
    bad = subprocess.run([sys.executable, "-m", "allocscope", "report", "--at", "nope", str(path)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no mark labelled 'nope'" in bad.stderr


def test_two_watched_modules_share_one_sequence_of_phases(tmp_path):
    model, criterion = nn.Linear(8, 3), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "two.alsc"
    with allocscope.record(path, device="cpu") as rec:
        rec.watch(model, opt)
        rec.watch(criterion, name="loss")
        for _ in range(2):
            criterion(model(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0])).backward()
            opt.step()
            opt.zero_grad()
    cap = allocscope.load(path)
    att = attribute(cap)
    phases = [(p, int(k)) for p, k in zip(att.phase_names, att.phase_iterations, strict=True)]
    assert phases == [("forward", 0), ("backward", 0), ("other", 0), ("optimizer", 0), ("other", 1),
                      ("forward", 1), ("backward", 1), ("other", 1), ("optimizer", 1), ("other", 2)]
    assert {"Linear", "loss"} <= set(att.names)
    # only the batch is an input: the loss module's inputs are the model's outputs
    ev = cap.events
    inputs = np.flatnonzero(ev.kind == allocscope.EventKind.INPUT)
    assert [cap.label(i) for i in inputs] == ["Linear.input[0]", "Linear.input[0]"]


class ReplacingSGD(torch.optim.Optimizer):
    """Momentum SGD that makes a new momentum tensor every step (as some
    hand-written optimizers do) instead of updating it in place."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.01})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    buf = self.state[p].get("buf")
                    self.state[p]["buf"] = p.grad.clone() if buf is None else buf * 0.9 + p.grad
                    p.add_(self.state[p]["buf"], alpha=-group["lr"])


def test_optimizer_state_made_anew_each_step_is_named_each_step(tmp_path):
    torch.manual_seed(0)
    model = ConvNet()
    opt = ReplacingSGD(model.parameters())
    path = tmp_path / "replacing.alsc"
    with allocscope.record(path, device="cpu") as rec:
        rec.watch(model, opt)
        for step in range(3):
            model(torch.randn(4, 3, 16, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if step == 1:  # a reload replaces every state tensor too
                opt.load_state_dict(opt.state_dict())
            allocscope.mark(f"step {step}")
    cap = allocscope.load(path)
    att = attribute(cap)
    for step in range(3):
        live = att.live(find_mark(cap, f"step {step}"))
        rows = np.flatnonzero(live & (att.category == 3))  # optimizer_state
        assert len(rows) == len(list(model.parameters()))
        # each named after its parameter: labelled, not left to the phase rule
        assert all(att.name(int(att.label[r])).endswith("/buf") for r in rows), step
    labels = int((cap.events.kind == allocscope.EventKind.OPTIMIZER_STATE).sum())
    assert labels == 3 * len(list(model.parameters()))  # after each step (the reload's are replaced unlabelled)


def test_a_watched_recording_that_allocated_nothing_still_reports(tmp_path):
    # The parameters' labels name memory from before recording and no row is
    # recorded: the labels make rows of their own (this raised IndexError).
    model = nn.Linear(8, 8)
    path = tmp_path / "idle.alsc"
    with allocscope.record(path, device="cpu") as rec:
        rec.watch(model)
    cap = allocscope.load(path)
    att = attribute(cap)
    assert int((att.category == CATEGORIES.index("parameter")).sum()) == 2  # weight and bias
    assert build_report(cap)["capture"]["events"] == len(cap.events)
