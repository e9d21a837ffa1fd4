"""Backward module scopes without the op callback (record(ops=False);
csrc/recorder/backward_scopes.h): every allocation gets the module and the
category it gets where ops are recorded, on the attribution tests'
training loops and on a reentrant checkpoint (a backward inside a node), on
the CPU and on CUDA (the autograd engine's device thread)."""

import functools
import gc

import numpy as np
import pytest
import torch

import allocscope
from allocscope.attribution import attribute
from allocscope.attribution.categories import CATEGORIES, PHASES
from allocscope.capture.format import MODULE_BACKWARD, EventKind

from .test_attribution_cpu import MODELS, CheckpointedNet


WORKLOADS = {**MODELS, "reentrant": (functools.partial(CheckpointedNet, reentrant=True),
                                      lambda: torch.randn(6, 20, requires_grad=True))}


def rows(path, device, name, ops):
    """(requested bytes, category, module, phase) of every allocation two
    watched training steps made; and the capture."""
    make_model, make_input = WORKLOADS[name]
    torch.manual_seed(0)
    model = make_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        loss = model(make_input().to(device)).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # (library workspaces and optimizer state exist before either recording)
    gc.collect()  # (the other recording's model, in reference cycles, is gone)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    with allocscope.record(path, device=device, ops=ops) as rec:
        rec.watch(model, opt)
        for _ in range(2):
            step()
    cap = allocscope.load(path)
    att = attribute(cap)
    out = [(int(s), CATEGORIES[c], att.names[m] if m >= 0 else None, PHASES[p])
           for s, c, m, p in zip(att.size, att.category, att.module, att.phase, strict=True)]
    # The recorded allocations, in order (not the memory from before the
    # recording: what earlier tests left in this process may be freed
    # during either recording)
    return [r for r, s in zip(out, att.start, strict=True) if s >= 0], cap


def _same_meaning(with_ops, without_ops):
    """Row by row equal, but for cuDNN workspaces, which only op names tell
    from temporaries (attribution/workspaces.py)."""
    assert len(with_ops) == len(without_ops)
    for a, b in zip(with_ops, without_ops, strict=True):
        if a[1] == "workspace" and b[1] == "temporary":
            b = (b[0], "workspace", *b[2:])
        assert a == b


def _check(tmp_path, device, name):
    torch.set_num_threads(1)  # (which intra-op thread allocates inside a parallel kernel varies)
    with_ops, cap_ops = rows(tmp_path / "ops.alsc", device, name, True)
    without_ops, cap = rows(tmp_path / "no_ops.alsc", device, name, False)
    assert cap.metadata["ops"] is False and not cap.events.op.any()
    _same_meaning(with_ops, without_ops)
    # Not vacuous: backward allocations sit in modules' backward scopes,
    # which the recorder wrote without the op callback.
    assert any(r[3] == "backward" and r[2] is not None and "." in r[2] for r in without_ops) \
        or name == "recurrent"  # (a submodule's, not the watched model's)
    ev = cap.events
    scopes = (ev.kind == EventKind.MODULE_ENTER) & (ev.addr & MODULE_BACKWARD != 0)
    assert scopes.any()
    assert not (ev.thread[scopes] == ev.thread[np.flatnonzero(ev.kind == EventKind.PHASE)[0]]).all() \
        or device == "cpu"  # on CUDA the engine's device thread writes them


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_backward_scopes_without_ops_match_the_op_callbacks_on_cpu(tmp_path, name):
    _check(tmp_path, "cpu", name)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_backward_scopes_without_ops_match_the_op_callbacks_on_cuda(tmp_path, name):
    _check(tmp_path, "cuda", name)
