"""The saved-tensor hook in C++ (csrc/recorder/saved.h) labels what the
Python hook it replaced labelled: on the attribution tests' models (CPU), the
ACTIVATION annotations and every allocation's category, module and tensor name
are the same as with the Python reference (watcher.PythonSavedTensorLabeler)."""

import gc

import numpy as np
import pytest
import torch

import allocscope
from allocscope import EventKind
from allocscope.attribution import attribute
from allocscope.attribution.categories import CATEGORIES
from allocscope.recording.saved_reference import PythonSavedTensorLabeler

from .test_attribution_cpu import MODELS


def recorded(path, make_model, make_input, reference):
    # One intra-op thread: at::parallel_for may hand a chunk (and the small
    # buffer it allocates) to a worker thread, which has no module scope of its
    # own, or keep it on the calling thread, run by run. Two captures of the
    # same model would then differ in that allocation's module for reasons
    # that have nothing to do with the hook under test (seen on CI, torch 2.11).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _recorded(path, make_model, make_input, reference)
    finally:
        torch.set_num_threads(threads)


def _recorded(path, make_model, make_input, reference):
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with allocscope.record(path, device="cpu") as rec:
        w = rec.watch(model, opt)
        if reference:
            w._saved = PythonSavedTensorLabeler(w)
        for _ in range(2):
            model(make_input()).float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    return labels_and_meaning(allocscope.load(path), EventKind.ACTIVATION)


def labels_and_meaning(cap, kind):
    """The annotations of this kind, (label, size), in order; and each
    recorded allocation's (category, module, tensor name, size)."""
    ev = cap.events
    labels = [(cap.strings[int(ev.arg[i])], int(ev.size[i])) for i in np.flatnonzero(ev.kind == kind)]
    att = attribute(cap)
    rows = np.flatnonzero(att.start >= 0)
    meaning = [(CATEGORIES[att.category[r]], att.names[att.module[r]] if att.module[r] >= 0 else None,
                att.names[att.label[r]] if att.label[r] >= 0 else None, int(att.size[r])) for r in rows]
    return labels, meaning


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_native_hook_labels_as_the_python_one_did(tmp_path, name):
    make_model, make_input = MODELS[name]
    labels, meaning = recorded(tmp_path / "native.alsc", make_model, make_input, reference=False)
    ref_labels, ref_meaning = recorded(tmp_path / "python.alsc", make_model, make_input, reference=True)
    assert labels and labels == ref_labels
    assert any(m[0] == "activation" for m in meaning)
    assert meaning == ref_meaning


class Tagged(torch.Tensor):
    """A subclass that keeps its type through ops (__torch_function__)."""


def test_saved_subclass_tensors_keep_their_type_and_gradients_are_unchanged(tmp_path):
    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.fc(x)
            return (h * h).sum()

    def grads(watched):
        torch.manual_seed(0)
        m = Probe()
        x = torch.randn(4, 8).as_subclass(Tagged)
        with allocscope.record(tmp_path / "s.alsc", device="cpu") as rec:
            if watched:
                rec.watch(m)
            m(x).backward()  # autograd saves Tagged tensors: the hook detaches them through Tagged.detach
        return [p.grad.clone() for p in m.parameters()]

    plain, watched = grads(False), grads(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    # the hook itself, on a subclass and on a plain tensor
    from allocscope.common.native import native

    with allocscope.record(tmp_path / "h.alsc", device="cpu") as rec:
        w = rec.watch(Probe())
        t = torch.randn(3, requires_grad=True)
        packed = w._saved.pack(t.as_subclass(Tagged))
        assert type(packed) is Tagged and not packed.requires_grad
        packed = w._saved.pack(t)
        assert type(packed) is torch.Tensor and packed.grad_fn is None and packed.data_ptr() == t.data_ptr()
        assert w._saved.unpack(packed) is packed
        with pytest.raises(TypeError):
            w._saved.pack(3)
    assert native().is_active() is False



class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@pytest.fixture
def python_saved_hooks(monkeypatch):
    from allocscope.recording.watcher import Watch

    def use(python):
        monkeypatch.setattr(Watch, "saved_hooks_in_cpp", not python)

    return use


@pytest.mark.parametrize("python", [False, True], ids=["engine", "python"])
def test_autograd_asks_allocscopes_engine_for_the_hook(tmp_path, python, python_saved_hooks):
    """By default the saved tensors of a watched forward are packed in C++
    (csrc/recorder/saved_engine.h): torch's Python hook mechanism is not
    called; the same tensors are packed either way."""
    python_saved_hooks(python)
    torch.manual_seed(0)
    model = TwoLayers()
    with allocscope.record(tmp_path / "r.alsc", device="cpu") as rec:
        w = rec.watch(model)
        model(torch.randn(4, 8)).sum().backward()
        native_packs, python_packs = w._saved.packed_natively, w._saved.packed_in_python
    # a.weight, x, tanh's output, b's input and weight: at least four saves
    assert (python_packs if python else native_packs) >= 4
    assert (native_packs if python else python_packs) == 0
    # the route is released with the watch: the same hook pushed by hand now goes through Python
    with torch.autograd.graph.saved_tensors_hooks(w._saved.pack_hook, w._saved.unpack_hook):
        TwoLayers()(torch.randn(4, 8)).sum().backward()
    assert w._saved.packed_natively == native_packs
    assert w._saved.packed_in_python > python_packs


def test_gradients_are_those_of_an_unwatched_model_on_either_route(tmp_path, python_saved_hooks):
    def grads(watched, python=False):
        python_saved_hooks(python)
        torch.manual_seed(0)
        m = TwoLayers()
        x = torch.randn(6, 8, requires_grad=True)
        with allocscope.record(tmp_path / "g.alsc", device="cpu") as rec:
            if watched:
                rec.watch(m)
            y = m(x)
            (y * y).sum().backward()  # y is saved by the loss, outside the model
        return [x.grad] + [p.grad for p in m.parameters()]

    plain = grads(False)
    for python in (False, True):
        assert all(torch.equal(a, b) for a, b in zip(plain, grads(True, python), strict=True))


def test_a_programs_own_hooks_inside_the_forward_still_pack(tmp_path):
    """Hooks the model pushes inside its forward are on top of the watcher's:
    they pack what is saved there, as without the watch (and those tensors get
    no label from the watcher, as before)."""
    packed = []

    class Hooked(TwoLayers):
        def forward(self, x):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
                return super().forward(x)

    def run(watched):
        packed.clear()
        torch.manual_seed(0)
        m = Hooked()
        with allocscope.record(tmp_path / "h.alsc", device="cpu") as rec:
            w = rec.watch(m) if watched else None
            m(torch.randn(4, 8)).sum().backward()
            natively = w._saved.packed_natively if w else 0
        return list(packed), natively

    assert run(True) == (run(False)[0], 0)


def test_a_programs_hooks_around_the_step_pack_as_without_the_watch(tmp_path):
    """saved_tensors_hooks around the whole step (as save_on_cpu) lie below the
    watcher's: they still pack every saved tensor, and what they keep is what
    gets the activation label."""
    kept = []

    def pack(t):
        copy = t.clone()  # what this program keeps instead of the tensor
        kept.append(copy)
        return copy

    def run(watched):
        kept.clear()
        torch.manual_seed(0)
        m = TwoLayers()
        path = tmp_path / f"o{watched}.alsc"
        with allocscope.record(path, device="cpu") as rec:
            if watched:
                rec.watch(m)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                m(torch.randn(4, 8)).sum().backward()
            grads = [p.grad for p in m.parameters()]
            addresses = {c.untyped_storage().data_ptr() for c in kept}
        return len(kept), grads, addresses, allocscope.load(path)

    count, grads, _, _ = run(False)
    watched_count, watched_grads, addresses, cap = run(True)
    assert watched_count == count > 0
    assert all(torch.equal(a, b) for a, b in zip(grads, watched_grads, strict=True))
    ev = cap.events
    labelled = {int(a) for a in ev.addr[ev.kind == EventKind.ACTIVATION]}
    # what the program kept (copies, of the weights too) is what is labelled
    assert labelled and labelled <= addresses


def test_compiled_autograd_unpacks_what_the_engine_packed(tmp_path, python_saved_hooks):
    """Compiled autograd asks each saved tensor's hooks for Python's unpack
    pair (retrieve_unpack_hook_data): the engine's C++ hooks give one, and the
    gradients are those of an unwatched model."""
    from torch._dynamo import compiled_autograd

    def grads(watched):
        torch.manual_seed(0)
        m = TwoLayers()
        with allocscope.record(tmp_path / "ca.alsc", device="cpu") as rec:
            w = rec.watch(m) if watched else None
            with compiled_autograd._enable(torch.compile(backend="eager")):
                m(torch.randn(4, 8)).sum().backward()
            if w is not None:
                assert w._saved.packed_natively > 0 and w._saved.packed_in_python == 0
        return [p.grad for p in m.parameters()]

    plain = grads(False)
    assert all(torch.equal(a, b) for a, b in zip(plain, grads(True), strict=True))


@pytest.mark.cuda
def test_save_on_cpu_keeps_a_watched_models_activations_off_the_gpu(tmp_path):
    """torch.autograd.graph.save_on_cpu around the step moves what autograd
    saves to the host; watching the model leaves that so (it once hid the
    program's hooks behind its own): at the end of the forward the GPU holds
    the same bytes as without the watch."""

    def after_forward(watched):
        torch.manual_seed(0)
        m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
                                  for _ in range(4)]).cuda()
        x = torch.randn(512, 256, device="cuda")
        m(x).sum().backward()  # (cuBLAS's workspace: allocated at the first matmul, kept)
        m.zero_grad(set_to_none=False)
        gc.collect()  # (an earlier test's cyclic garbage, freed in the forward, would count against it)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        with allocscope.record(tmp_path / f"c{watched}.alsc", device="cuda") as rec:
            if watched:
                rec.watch(m)
            with torch.autograd.graph.save_on_cpu():
                loss = m(x).sum()
                held = torch.cuda.memory_allocated() - base
                loss.backward()
        return held

    held = after_forward(False)
    assert held < 4 * 512 * 256 * 4  # (less than the four layers' activations: they are on the host)
    assert after_forward(True) == held


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(MODELS))
def test_on_cuda_the_engine_route_labels_as_the_python_route(tmp_path, name, python_saved_hooks):
    """On the real caching allocator, the attribution models' training steps:
    the same ACTIVATION labels, and every allocation's category, module and
    tensor name, with the hooks packed in C++ as through torch's Python
    mechanism."""
    make_model, make_input = MODELS[name]

    def run(python):
        python_saved_hooks(python)
        torch.manual_seed(0)
        model = make_model().cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        path = tmp_path / f"{python}.alsc"
        with allocscope.record(path, device="cuda") as rec:
            rec.watch(model, opt)
            for _ in range(2):
                model(make_input().cuda()).float().square().mean().backward()
                opt.step()
                opt.zero_grad()
        return labels_and_meaning(allocscope.load(path), EventKind.ACTIVATION)

    torch.manual_seed(0)
    warm = make_model().cuda()
    warm(make_input().cuda()).float().square().mean().backward()  # (what the first step keeps: cuBLAS's workspace)
    del warm
    labels, meaning = run(python=False)
    ref_labels, ref_meaning = run(python=True)
    assert labels and labels == ref_labels
    assert any(m[0] == "activation" for m in meaning)
    assert meaning == ref_meaning
