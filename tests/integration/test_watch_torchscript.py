"""TorchScript under a watch: a watch wraps torch.autograd.grad and backward
(recording/phases.py), which TorchScript knows by identity; the wrappers are
registered as the same builtins, so scripted functions that call them
compile and compute as without a watch (PyTorch's own test_autograd.py
TestMultithreadAutograd::test_fork_join_in_middle failed under a watch)."""

import warnings

import numpy as np
import torch
from torch import nn

import allocscope
from allocscope import EventKind


def _scripted():
    """Scripted anew each call (TorchScript caches what it compiled per
    function object)."""
    def grad(x):
        return torch.autograd.grad([(x * x).sum()], [x])

    def backward(x):
        torch.autograd.backward([(x * x * x).sum()])
        return x

    # (torch.jit.script is deprecated: a FutureWarning in torch 2.14, a DeprecationWarning in 2.11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(grad), torch.jit.script(backward)


def _run(grad_fn, backward_fn):
    x = torch.arange(5.0, requires_grad=True)
    (g,) = grad_fn(x)
    backward_fn(x)
    return g, x.grad


def test_scripted_grad_and_backward_compile_and_compute_the_same_under_a_watch(tmp_path):
    expected = _run(*_scripted())
    assert torch.equal(expected[0], 2 * torch.arange(5.0)) and torch.equal(expected[1], 3 * torch.arange(5.0) ** 2)
    model = nn.Linear(2, 2)
    with allocscope.record(tmp_path / "ts.alsc", device="cpu") as rec:
        rec.watch(model)
        assert torch.autograd.grad is not allocscope.recording.phases.Phases.original_grad  # wrapped
        watched = _scripted()
        got = _run(*watched)
        model(torch.ones(1, 2)).sum().backward()  # the wrappers still mark eager backward
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    # scripted under the watch, called after it: the graph holds aten::grad, not the wrapper
    assert all(torch.equal(a, b) for a, b in zip(_run(*watched), expected))
    # and scripting after the watch still finds torch's own functions
    assert all(torch.equal(a, b) for a, b in zip(_run(*_scripted()), expected))
    cap = allocscope.load(tmp_path / "ts.alsc")
    phases = [cap.label(int(i)) for i in np.flatnonzero(cap.events.kind == EventKind.PHASE)]
    # Only the eager backward marks its phase: the scripted calls do not pass through the wrappers
    assert phases.count("backward") == 1, phases
