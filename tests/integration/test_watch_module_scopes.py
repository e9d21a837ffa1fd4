"""A watched model's modules write their scopes from wrapped forwards
(recording/module_scopes.py), not forward hooks: what user code can see of
a module stays as it was (its signature, deepcopy, pickling, its forward once
the recording ends), an exception still closes the scope, and a forward
someone else wrapped keeps working. What the scopes say is compared with the
hooks' in test_watch_module_hooks.py, a compiled model's graphs in
test_watch_compile.py."""

import copy
import functools
import gc
import inspect
import pickle
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import allocscope
from allocscope import EventKind
from allocscope.recording.module_scopes import ForwardWrapper
from allocscope.recording.watcher import Watch


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x, scale: float = 1.0, *, shift: float = 0.0):
        return self.act(self.lin(x)) * scale + shift


class Failing(nn.Module):
    def forward(self, x):
        raise ValueError("the model's own error")


def scopes(path):
    cap = allocscope.load(path)
    ev = cap.events
    idx = np.flatnonzero((ev.kind == EventKind.MODULE_ENTER) | (ev.kind == EventKind.MODULE_EXIT))
    return [("enter" if ev.kind[i] == EventKind.MODULE_ENTER else "exit", cap.strings[int(ev.arg[i])]) for i in idx]


def test_a_watched_module_looks_as_before(tmp_path):
    model = nn.Sequential(Block(), Block())
    with allocscope.record(tmp_path / "s.alsc", device="cpu") as rec:
        rec.watch(model)
        block = model[0]
        assert "forward" in vars(block)  # (wrapped: the test would say nothing otherwise)
        assert isinstance(vars(block)["forward"], functools.partial)  # (the C wrapper: module_scopes.py)
        assert inspect.signature(block.forward) == inspect.signature(Block.forward.__get__(block))
        assert block.forward.__name__ == "forward" and block.forward.__self__ is block
        assert block.forward.__func__ is Block.forward
        # the rest as a bound method gives it: its function's (vLLM keys
        # its compile cache on forward.__code__)
        assert block.forward.__code__ is Block.forward.__code__
        assert block.forward.__qualname__ == Block.forward.__qualname__
        with pytest.raises(AttributeError, match="no_such_attribute"):
            block.forward.no_such_attribute
        # (attributes of the wrapper's type: functools.update_wrapper, as
        # accelerate wraps a forward, copies an instance's __dict__ along)
        assert not {"__self__", "__func__"} & set(vars(block.forward))

        twin = copy.deepcopy(model)
        with torch.no_grad():
            for p in twin.parameters():
                p.zero_()
        x = torch.randn(3, 8)
        assert torch.equal(twin(x), torch.zeros(3, 8))  # the copy's forward runs on the copy
        assert not torch.equal(model(x), torch.zeros(3, 8))

        # Pickled, a wrapped forward is getattr(module, "forward"): nothing of allocscope
        data = pickle.dumps(block)
        assert b"allocscope" not in data
        restored = pickle.loads(data)
        assert torch.equal(restored(x), block(x))
    assert all("forward" not in vars(m) for m in model.modules())  # the class's forward again
    written = scopes(tmp_path / "s.alsc")
    # The copy's call: the root's hooks, deep-copied with it, write; its
    # modules run the class's forward (a copy's calls are not the watched
    # modules' calls). Then the model's.
    assert written[:2] == [("enter", "Sequential"), ("exit", "Sequential")]
    assert written[2:8] == [("enter", "Sequential"), ("enter", "Sequential.0"),
                            ("enter", "Sequential.0.lin"), ("exit", "Sequential.0.lin"),
                            ("enter", "Sequential.0.act"), ("exit", "Sequential.0.act")]


@pytest.mark.parametrize("way", ["c_partial", "python_wrapper", "hooks"])
def test_an_exception_closes_the_scopes_it_opened(tmp_path, way):
    # As a forward hook with always_call=True: the wrappers and the Python
    # hooks (their reference) write the same.
    model = nn.Sequential(Block(), Failing())
    Watch.native_module_hooks = way != "hooks"
    ForwardWrapper.in_c = way == "c_partial"
    try:
        with allocscope.record(tmp_path / "e.alsc", device="cpu") as rec:
            rec.watch(model)
            with pytest.raises(ValueError, match="own error"):
                model(torch.randn(2, 8))
    finally:
        Watch.native_module_hooks = True
        ForwardWrapper.in_c = True
    assert scopes(tmp_path / "e.alsc")[-3:] == [("enter", "Sequential.1"), ("exit", "Sequential.1"),
                                                ("exit", "Sequential")]


class Many(nn.Module):
    def forward(self, a, b, c, d, e, f, g, h, i, j, *rest, scale=1.0, **extra):
        return (a + b + c + d + e + f + g + h + i + j + sum(rest)) * scale + sum(extra.values())


def test_a_wrapped_forward_passes_every_argument_through(tmp_path):
    # (more positional arguments than the C wrapper's stack holds: it takes
    # the heap; keyword-only and ** arguments reach the forward too)
    model = nn.Sequential(Many())
    args = [torch.full((2,), float(i)) for i in range(12)]
    want = Many()(*args, scale=2.0, bias=torch.ones(2))
    with allocscope.record(tmp_path / "m.alsc", device="cpu") as rec:
        rec.watch(nn.ModuleList([model]))
        assert isinstance(vars(model[0])["forward"], functools.partial)
        assert torch.equal(model[0](*args, scale=2.0, bias=torch.ones(2)), want)
        assert torch.equal(model[0](*args[:10]), Many()(*args[:10]))
        with pytest.raises(TypeError):
            model[0](*args[:3])  # the forward's own error, as unwatched
        stray = type(vars(model[0])["forward"])(Many.forward)  # (its type is reachable: made elsewhere)
        with pytest.raises(TypeError, match="binds its module alone"):
            stray(*args[:10])
    assert scopes(tmp_path / "m.alsc") == [("enter", "ModuleList.0.0"), ("exit", "ModuleList.0.0")] * 3


def test_the_watch_does_not_keep_a_dropped_model_alive(tmp_path):
    # (the wrapper holds its module, the module its wrapper: a cycle the
    # collector frees; the watch holds the model weakly)
    model = nn.Sequential(Block(), Block())
    gone = weakref.ref(model[0].lin)
    with allocscope.record(tmp_path / "d.alsc", device="cpu") as rec:
        rec.watch(model)
        assert isinstance(vars(model[0].lin)["forward"], functools.partial)
        model(torch.randn(2, 8))
        del model
        gc.collect()
        assert gone() is None


def test_someone_elses_forward_wrapper_keeps_working(tmp_path):
    model = nn.Sequential(Block(), Block())
    calls = []

    def wrap(module):
        inner = module.forward

        def forward(*args, **kwargs):
            calls.append(module)
            return inner(*args, **kwargs)

        module.forward = forward

    wrap(model[0])  # before the watch: the watch uses hooks for that module
    with allocscope.record(tmp_path / "w.alsc", device="cpu") as rec:
        watch = rec.watch(model)
        wrap(model[1])  # after: wraps the watch's wrapper
        model(torch.randn(2, 8))
        watch.remove()
        out = model(torch.randn(2, 8))  # (the watch's wrapper inside model[1]'s now only calls the forward)
    assert calls == [model[0], model[1], model[0], model[1]] and out.shape == (2, 8)
    assert "forward" in vars(model[0]) and "forward" in vars(model[1])
    written = scopes(tmp_path / "w.alsc")
    assert ("enter", "Sequential.0") in written and ("enter", "Sequential.1") in written
    assert written.count(("enter", "Sequential.1")) == 1  # nothing after the removal


class Doubling(nn.Module):
    @staticmethod
    def forward(x):
        return x * 2


def test_a_forward_that_cannot_be_wrapped_gets_hooks(tmp_path):
    # (a staticmethod forward takes no module: the wrapper would pass one)
    model = nn.Sequential(Doubling(), nn.Linear(8, 8))
    x = torch.randn(2, 8)
    with allocscope.record(tmp_path / "h.alsc", device="cpu") as rec:
        rec.watch(model)
        assert "forward" not in vars(model[0]) and "forward" in vars(model[1])
        assert torch.equal(model(x), model[1](x * 2))
    assert scopes(tmp_path / "h.alsc")[:5] == [("enter", "Sequential"), ("enter", "Sequential.0"),
                                               ("exit", "Sequential.0"), ("enter", "Sequential.1"),
                                               ("exit", "Sequential.1")]


@pytest.mark.cuda
def test_what_autograd_saved_is_freed_without_the_garbage_collector(tmp_path):
    # The saved-tensor hook packs a tensor with a grad_fn without it (an
    # output that held its own node would never be freed where no backward
    # frees the saved tensors: an identity pack hook leaks here) and a leaf
    # as it is: all of it goes by reference counting alone.
    model = nn.Sequential(Block(), Block()).cuda()
    gc.collect()
    gc.disable()
    try:
        with allocscope.record(tmp_path / "f.alsc") as rec:
            rec.watch(model)
            allocated = []
            for _ in range(3):
                x = torch.randn(16, 8, device="cuda", requires_grad=True)
                y = model(x).exp()  # exp saves its output
                y.sum().backward()
                dropped = model(x).exp()  # a graph left without backward
                del x, y, dropped
                model.zero_grad(set_to_none=True)
                allocated.append(torch.cuda.memory_allocated())  # (the first step's: cuBLAS's workspace too)
    finally:
        gc.enable()
    assert allocated[1] == allocated[0] and allocated[2] == allocated[0]
