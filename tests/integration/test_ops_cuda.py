"""The op behind each allocation on CUDA (marked `cuda`: the virtual GPU in
CI), where backward runs on the autograd engine's device thread, which has no
Python frames: its allocations take the stack of their node's forward op."""

import numpy as np
import pytest
import torch

import allocscope
from allocscope import EventKind

from .layered_model import Layered
from .test_ops_cpu import check_backward_lines, trained_parameters

pytestmark = pytest.mark.cuda


def test_backward_allocations_on_the_engine_thread_carry_the_forward_line(tmp_path):
    torch.manual_seed(0)
    model = Layered().cuda()
    opt = torch.optim.Adam(model.parameters())
    with allocscope.record(tmp_path / "b.alsc", device="cuda") as rec:
        rec.watch(model, opt)
        for _ in range(2):
            model(torch.randn(16, 32, device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad()
    cap = allocscope.load(tmp_path / "b.alsc")
    ev = cap.events
    allocs = np.flatnonzero(ev.kind == EventKind.ALLOC)
    python_threads = set(ev.thread[ev.kind == EventKind.MARK].tolist()) | {int(ev.thread[allocs[0]])}
    engine = [i for i in allocs.tolist() if int(ev.thread[i]) not in python_threads]
    assert engine, "backward ran on the calling thread: this test needs the engine's device thread"
    assert all(ev.stack[i] != 0 for i in engine)
    check_backward_lines(cap)


def test_recording_ops_changes_no_result_on_cuda(tmp_path):
    plain = trained_parameters("cuda")
    recorded = trained_parameters("cuda", tmp_path / "r.alsc")
    assert all(torch.equal(a, b) for a, b in zip(plain, recorded, strict=True))
