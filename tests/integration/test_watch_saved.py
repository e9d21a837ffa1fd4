"""The saved-tensor hook in C++ (csrc/recorder/saved.h) labels what the
Python hook it replaced labelled: on the attribution tests' models (CPU), the
ACTIVATION annotations and every allocation's category, module and tensor name
are the same as with the Python reference (watcher.PythonSavedTensorLabeler)."""

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

