"""A watched model's modules write their scopes from wrapped forwards
(recording/module_scopes.py), not forward hooks: what user code can see of
a module stays as it was (its signature, deepcopy, pickling, its forward once
the recording ends), an exception still closes the scope, and a forward
someone else wrapped keeps working. What the scopes say is compared with the
hooks' in test_watch_module_hooks.py, a compiled model's graphs in
test_watch_compile.py."""

import copy
import gc
import inspect
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import allocscope
from allocscope import EventKind
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
        assert inspect.signature(block.forward) == inspect.signature(Block.forward.__get__(block))
        assert block.forward.__name__ == "forward" and block.forward.__self__ is block

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
    assert scopes(tmp_path / "s.alsc")[:6] == [("enter", "Sequential"), ("enter", "Sequential.0"),
                                               ("enter", "Sequential.0.lin"), ("exit", "Sequential.0.lin"),
                                               ("enter", "Sequential.0.act"), ("exit", "Sequential.0.act")]


@pytest.mark.parametrize("wrapped", [True, False])
def test_an_exception_closes_the_scopes_it_opened(tmp_path, wrapped):
    # As a forward hook with always_call=True: the wrapper and the Python
    # hooks (its reference) write the same.
    model = nn.Sequential(Block(), Failing())
    Watch.native_module_hooks = wrapped
    try:
        with allocscope.record(tmp_path / "e.alsc", device="cpu") as rec:
            rec.watch(model)
            with pytest.raises(ValueError, match="own error"):
                model(torch.randn(2, 8))
    finally:
        Watch.native_module_hooks = True
    assert scopes(tmp_path / "e.alsc")[-3:] == [("enter", "Sequential.1"), ("exit", "Sequential.1"),
                                                ("exit", "Sequential")]


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
