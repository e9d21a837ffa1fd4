"""Gradient labels from the op callback (csrc/recorder/gradients.h) are what
the Python post-accumulate-grad hooks they replace wrote: on the attribution
tests' models (CPU) and on the virtual GPU, where AccumulateGrad runs on the
autograd engine's own thread, the GRADIENT annotations, every allocation's
category, module and tensor name, and the report are the same as with the
hooks (Watch.native_gradients = False)."""

import gc
import weakref

import numpy as np
import pytest
import torch

import allocscope
from allocscope import EventKind
from allocscope.attribution import attribute
from allocscope.attribution.categories import CATEGORIES
from allocscope.recording.watcher import Watch
from allocscope.reports.report import build_report

from .test_attribution_cpu import MODELS
from .test_watch_saved import labels_and_meaning


def recorded(path, make_model, make_input, native, device="cpu", set_to_none=True, ops=None):
    # One intra-op thread: see test_watch_saved.recorded.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    Watch.native_gradients = native
    gc.collect()  # (what an earlier recording left in cycles is not freed during this one)
    try:
        torch.manual_seed(0)
        model = make_model().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        with allocscope.record(path, device=device, ops=ops) as rec:
            w = rec.watch(model, opt)
            assert (type(w._gradients).__name__ == "GradientWatch") == native
            for step in range(3):
                model(make_input().to(device)).float().square().mean().backward()
                opt.step()
                allocscope.mark(f"step {step}")
                opt.zero_grad(set_to_none=set_to_none)
    finally:
        Watch.native_gradients = True
        torch.set_num_threads(threads)
    cap = allocscope.load(path)
    labels, meaning = labels_and_meaning(cap, EventKind.GRADIENT)
    report = timeless({k: v for k, v in build_report(cap, at="step 1").items() if k not in ("capture",)})
    return labels, meaning, report


def timeless(value):
    """A report without its clock readings (keys ending in _ns)."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not k.endswith("_ns")}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_are_labelled_as_the_hooks_labelled_them(tmp_path, name):
    make_model, make_input = MODELS[name]
    native = recorded(tmp_path / "native.alsc", make_model, make_input, native=True)
    hooks = recorded(tmp_path / "hooks.alsc", make_model, make_input, native=False)
    labels, meaning, report = native
    assert labels and labels == hooks[0]
    assert any(m[0] == "gradient" for m in meaning)
    assert meaning == hooks[1]
    assert report == hooks[2]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_without_ops_the_native_hook_labels_as_the_python_hooks(tmp_path, name):
    # record(ops=False): no op callback sees AccumulateGrad end; each
    # parameter's post-accumulate-grad hook is allocscope._C.label_gradient.
    make_model, make_input = MODELS[name]
    native = recorded(tmp_path / "native.alsc", make_model, make_input, native=True, ops=False)
    hooks = recorded(tmp_path / "hooks.alsc", make_model, make_input, native=False, ops=False)
    assert native[0] and native[0] == hooks[0]
    assert native[1] == hooks[1] and native[2] == hooks[2]


def test_gradients_kept_between_steps_are_labelled_each_step(tmp_path):
    # zero_grad(set_to_none=False): the same gradient memory accumulates again.
    make_model, make_input = MODELS["conv"]
    native = recorded(tmp_path / "native.alsc", make_model, make_input, native=True, set_to_none=False)
    hooks = recorded(tmp_path / "hooks.alsc", make_model, make_input, native=False, set_to_none=False)
    assert native[0] == hooks[0] and native[1] == hooks[1]
    names = [n for n, _ in native[0]]
    assert len(names) == 3 * len(set(names))


@pytest.mark.cuda
def test_gradients_on_the_engine_thread_of_the_virtual_gpu(tmp_path):
    make_model, make_input = MODELS["attention"]
    # First a run that sets up what a process sets up once (cuBLAS's workspace).
    recorded(tmp_path / "first.alsc", make_model, make_input, native=False, device="cuda")
    native = recorded(tmp_path / "native.alsc", make_model, make_input, native=True, device="cuda")
    hooks = recorded(tmp_path / "hooks.alsc", make_model, make_input, native=False, device="cuda")
    assert native[0] and native[0] == hooks[0]
    # (the reports hold the memory earlier tests left in this process, which
    # may be freed during either recording: the recorded rows are compared)
    assert native[1] == hooks[1]


def test_a_model_deleted_while_watched_is_freed(tmp_path):
    # The parameters are held weakly: the model's memory goes when it does.
    with allocscope.record(tmp_path / "d.alsc", device="cpu") as rec:
        model = torch.nn.Linear(64, 64)
        rec.watch(model)
        model(torch.randn(2, 64)).sum().backward()
        gone = weakref.ref(model.weight)
        del model
        gc.collect()
        assert gone() is None
        other = torch.nn.Linear(64, 64)  # (may reuse the freed parameters' addresses: no label)
        other(torch.randn(2, 64)).sum().backward()
    cap = allocscope.load(tmp_path / "d.alsc")
    ev = cap.events
    names = [cap.strings[int(ev.arg[i])] for i in np.flatnonzero(ev.kind == EventKind.GRADIENT)]
    assert sorted(names) == ["Linear.bias", "Linear.weight"]


def test_an_optimizer_run_in_backward_reads_the_same(tmp_path):
    # PyTorch's recipe: each parameter's own optimizer steps in a
    # post-accumulate-grad hook and takes the gradient away. Registered
    # before the watch, it runs before the Python hooks did, as before the
    # native label: neither finds a gradient to label.
    def run(path, native):
        Watch.native_gradients = native
        gc.collect()
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
            opts = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}

            def step(p):
                opts[p].step()
                opts[p].zero_grad(set_to_none=True)

            handles = [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]
            with allocscope.record(path, device="cpu") as rec:
                rec.watch(model)
                for _ in range(2):
                    model(torch.randn(8, 16)).square().mean().backward()
            for h in handles:
                h.remove()
        finally:
            Watch.native_gradients = True
        cap = allocscope.load(path)
        att = attribute(cap)
        rows = np.flatnonzero(att.start >= 0)
        return ([int(k) for k in cap.events.kind], [(CATEGORIES[att.category[r]], int(att.size[r])) for r in rows],
                [p.detach().clone() for p in model.parameters()])

    native, hooks = run(tmp_path / "native.alsc", True), run(tmp_path / "hooks.alsc", False)
    assert native[0] == hooks[0] and native[1] == hooks[1]
    assert EventKind.GRADIENT not in native[0]
    assert all(torch.equal(a, b) for a, b in zip(native[2], hooks[2], strict=True))
