"""A watched model is the program's model as it was: watching leaves nothing
on it (recording/global_hooks.py) that pickling, copy.deepcopy, torch.save,
state_dict, the hook dicts, TorchScript, FX or torch.export would see or
carry, the program's own hooks run in their order, and a model the program
drops is freed at once, as unwatched. Each check compares the watched
model with the same model unwatched. The scopes the watch writes are
compared with their Python reference in test_watch_module_hooks.py, a
compiled model's graphs in test_watch_compile.py."""

import copy
import gc
import io
import pickle
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import allocscope
from allocscope import EventKind
from allocscope.recording.global_hooks import GlobalHooks
from allocscope.recording.watcher import Watch


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x, scale: float = 1.0, *, shift: float = 0.0):
        return self.act(self.lin(x)) * scale + shift


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.blocks(x))


class Failing(nn.Module):
    def forward(self, x):
        raise ValueError("the model's own error")


def scopes(path):
    cap = allocscope.load(path)
    ev = cap.events
    idx = np.flatnonzero((ev.kind == EventKind.MODULE_ENTER) | (ev.kind == EventKind.MODULE_EXIT))
    return [("enter" if ev.kind[i] == EventKind.MODULE_ENTER else "exit", cap.strings[int(ev.arg[i])]) for i in idx]


def trained(seed=0):
    """A Net and its SGD with momentum after one step (state in the optimizer)."""
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    return model, opt


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_a_watched_model_saves_pickles_and_copies_as_unwatched(tmp_path):
    model, opt = trained()
    plain = {"pickle": pickle.dumps(model), "save": saved(model), "opt": saved(opt), "state": saved(model.state_dict()),
             "opt_state": saved(opt.state_dict()), "vars": [sorted(vars(m)) for m in model.modules()]}
    with allocscope.record(tmp_path / "s.alsc", device="cpu") as rec:
        # (the same objects: a pickle names each storage by its address)
        watched_model, watched_opt = model, opt
        watch = rec.watch(watched_model, watched_opt)
        with torch.no_grad():
            watched_model(torch.randn(4, 8))  # (a watched call: the weights stay)
        assert watch.model is watched_model
        assert pickle.dumps(watched_model) == plain["pickle"]
        assert saved(watched_model) == plain["save"]
        assert saved(watched_opt) == plain["opt"]
        assert saved(watched_model.state_dict()) == plain["state"]
        assert saved(watched_opt.state_dict()) == plain["opt_state"]
        assert [sorted(vars(m)) for m in watched_model.modules()] == plain["vars"]
        for m in watched_model.modules():
            assert not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)
        assert not (watched_opt._optimizer_step_pre_hooks or watched_opt._optimizer_step_post_hooks)

        # A copy is a model of its own, unwatched; the original stays watched.
        twin = copy.deepcopy(watched_model)
        restored = torch.load(io.BytesIO(saved(watched_model)), weights_only=False)
        x = torch.randn(3, 8)
        assert torch.equal(twin(x), watched_model(x)) and torch.equal(restored(x), watched_model(x))
        restored.load_state_dict(watched_model.state_dict())
        allocscope.mark("copies called")
    written = scopes(tmp_path / "s.alsc")
    # The twin's and the restored model's calls wrote nothing; the watched model's last call did.
    names = {name for _, name in written}
    assert "Net" in names and "Net.blocks.0.lin" in names


def test_a_watched_model_loads_and_converts_by_swapping_tensors(tmp_path):
    # torch.utils.swap_tensors refuses a tensor that has a weak reference:
    # the watch holds none to parameters (only to modules)
    model, source = Net(), Net()
    x = torch.randn(2, 8)
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with allocscope.record(tmp_path / "w.alsc", device="cpu") as rec:
            rec.watch(model)
            model(x)
            weight = model.head.weight
            model.load_state_dict(source.state_dict())  # swaps every parameter
            model.double()  # swaps again
            assert model.head.weight is weight and weight.dtype == torch.float64  # (the same objects, swapped)
            assert torch.equal(model.head.bias, source.head.bias.double())
            assert all(weakref.getweakrefcount(p) == 0 for p in model.parameters())
            model(x.double())
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)
    cap = allocscope.load(tmp_path / "w.alsc")
    ev = cap.events
    named = [cap.strings[int(ev.arg[i])] for i in np.flatnonzero(ev.kind == EventKind.PARAMETER)]
    assert named.count("Net.head.weight") == 2  # labelled again once they moved


def test_the_programs_hooks_run_in_their_order(tmp_path):
    def run(watched: bool) -> list[str]:
        model = Net()
        calls = []
        model.blocks[0].register_forward_pre_hook(lambda m, a: calls.append("pre A"))
        model.blocks[0].register_forward_hook(lambda m, a, o: calls.append("post A"))
        handle = model.blocks[0].register_forward_hook(lambda m, a, o: calls.append("post first"), prepend=True)
        with allocscope.record(tmp_path / f"h{watched}.alsc", device="cpu") as rec:
            if watched:
                rec.watch(model)
            model.blocks[0].register_forward_pre_hook(lambda m, a: calls.append("pre B"))
            model.blocks[0].register_forward_hook(lambda m, a, o: calls.append("post B"), always_call=True)
            model.register_forward_hook(lambda m, a, o: calls.append("root post"))
            model(torch.randn(2, 8))
            handle.remove()
            model(torch.randn(2, 8))
        return calls

    assert run(True) == run(False)
    assert run(True)[:5] == ["pre A", "pre B", "post first", "post A", "post B"]


def test_a_dropped_model_is_freed_at_once_and_said_gone(tmp_path):
    # No reference cycle through the watch, so no garbage collector needed:
    # its memory goes when the program lets go of it, as unwatched.
    gc.collect()
    gc.disable()
    try:
        with allocscope.record(tmp_path / "d.alsc", device="cpu") as rec:
            model, opt = trained()
            watch = rec.watch(model, opt)
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            parts = [weakref.ref(m) for m in model.modules()] + [weakref.ref(opt)]
            parts += [weakref.ref(p) for p in model.parameters()]
            referrers = [r for r in gc.get_referrers(model) if type(r).__module__.startswith("allocscope")]
            assert referrers == []
            del model, opt
            assert all(r() is None for r in parts)
            assert watch.model is None and watch not in rec._watches
            assert not GlobalHooks.installed()  # (the last watch gone: torch's calls take their fast path)
    finally:
        gc.enable()
    cap = allocscope.load(tmp_path / "d.alsc")
    ev = cap.events
    updates = [cap.strings[int(ev.arg[i])] for i in np.flatnonzero(ev.kind == EventKind.WATCH)]
    assert any('"gone": true' in u for u in updates)


@pytest.mark.parametrize("native", [True, False])
def test_an_exception_closes_the_scopes_it_opened(tmp_path, native):
    # As a forward hook with always_call=True does: the C functions and
    # their Python reference write the same.
    model = nn.Sequential(Block(), Failing())
    Watch.native_module_hooks = native
    try:
        with allocscope.record(tmp_path / "e.alsc", device="cpu") as rec:
            rec.watch(model)
            with pytest.raises(ValueError, match="own error"):
                model(torch.randn(2, 8))
    finally:
        Watch.native_module_hooks = True
    assert scopes(tmp_path / "e.alsc")[-3:] == [("enter", "Sequential.1"), ("exit", "Sequential.1"),
                                                ("exit", "Sequential")]


class Many(nn.Module):
    def forward(self, a, b, c, d, e, f, g, h, i, j, *rest, scale=1.0, **extra):
        return (a + b + c + d + e + f + g + h + i + j + sum(rest)) * scale + sum(extra.values())


class Doubling(nn.Module):
    @staticmethod
    def forward(x):
        return x * 2


def test_every_forward_is_called_as_it_was(tmp_path):
    model = nn.Sequential(Many())
    args = [torch.full((2,), float(i)) for i in range(12)]
    want = Many()(*args, scale=2.0, bias=torch.ones(2))
    calls = []
    other = nn.Sequential(Doubling(), nn.Linear(8, 8))
    inner = other[1].forward

    def wrapped(*a, **k):  # someone else's wrapper, as accelerate's
        calls.append(1)
        return inner(*a, **k)

    other[1].forward = wrapped
    x = torch.randn(2, 8)
    with allocscope.record(tmp_path / "m.alsc", device="cpu") as rec:
        holder = nn.ModuleList([model])  # (a watch ends with its model: this one must live)
        rec.watch(holder)
        rec.watch(other)
        assert torch.equal(model[0](*args, scale=2.0, bias=torch.ones(2)), want)
        with pytest.raises(TypeError):
            model[0](*args[:3])  # the forward's own error, as unwatched
        assert torch.equal(other(x), other[1](x * 2)) and calls == [1, 1]
    written = scopes(tmp_path / "m.alsc")
    assert written[:2] == [("enter", "ModuleList.0.0"), ("exit", "ModuleList.0.0")]
    assert written[4:9] == [("enter", "Sequential"), ("enter", "Sequential.0"), ("exit", "Sequential.0"),
                            ("enter", "Sequential.1"), ("exit", "Sequential.1")]


def _exported(model, x):
    """What TorchScript, FX and torch.export make of the model."""
    out = {"trace": torch.jit.trace(model, x).graph.str().count("aten::"),
           "script": str(torch.jit.script(model).graph).count("aten::"),
           "fx": torch.fx.symbolic_trace(model).code}
    out["export"] = str(torch.export.export(model, (x,)).graph_module.code)
    return out


@pytest.mark.filterwarnings("ignore::FutureWarning")  # (torch.jit is deprecated, and still used)
def test_tracing_scripting_and_exporting_a_watched_model_give_what_unwatched_gives(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(3, 8)
    plain = _exported(model, x)
    with allocscope.record(tmp_path / "t.alsc", device="cpu") as rec:
        rec.watch(model)
        model(x)
        assert _exported(model, x) == plain
        assert torch.equal(torch.jit.script(model)(x), model(x))


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
