"""The C functions that write a watched module's scopes
(csrc/recorder/module_hooks.h, called from the process's global hooks,
recording/global_hooks.py) write what their Python reference writes
(Watch.native_module_hooks = False): the same MODULE_ENTER/EXIT events,
leaf output bytes included, and the same meaning for every allocation, on
the attribution tests' models and on modules whose inputs and outputs are
not one plain tensor (where the C function asks Python for the leaf's
bytes)."""

import gc

import numpy as np
import pytest
import torch
from torch import nn

import allocscope
from allocscope import EventKind
from allocscope.recording.watcher import Watch

from .test_attribution_cpu import MODELS
from .test_watch_saved import labels_and_meaning


class Tagged(torch.Tensor):
    """A tensor subclass: the C function does not read its storage."""


class Odd(nn.Module):
    """Leaves called with several inputs, keyword inputs, tuple and dict
    outputs, a subclass output, an in-place output and a view."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.relu = nn.ReLU(inplace=True)
        self.flat = nn.Flatten()
        self.bil = nn.Bilinear(8, 8, 4)
        self.lstm = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x):
        h = self.relu(self.lin(x))
        y = self.bil(h, x)
        out, (hn, cn) = self.lstm(h.unsqueeze(1))
        tagged = self.lin(x.as_subclass(Tagged)).as_subclass(torch.Tensor)
        return self.flat(out).sum() + y.sum() + hn.sum() + tagged.sum()


WORKLOADS = {**MODELS, "odd": (Odd, lambda: torch.randn(5, 8))}


def scopes_and_meaning(path, name, native):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (see test_watch_saved.recorded)
    Watch.native_module_hooks = native
    gc.collect()
    try:
        make_model, make_input = WORKLOADS[name]
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        with allocscope.record(path, device="cpu") as rec:
            rec.watch(model, opt)
            for _ in range(2):
                model(make_input()).float().square().mean().backward()
                opt.step()
                opt.zero_grad()
    finally:
        Watch.native_module_hooks = True
        torch.set_num_threads(threads)
    cap = allocscope.load(path)
    ev = cap.events
    idx = np.flatnonzero((ev.kind == EventKind.MODULE_ENTER) | (ev.kind == EventKind.MODULE_EXIT))
    scopes = [(int(ev.kind[i]), cap.strings[int(ev.arg[i])], int(ev.addr[i]), int(ev.size[i])) for i in idx]
    return scopes, labels_and_meaning(cap, EventKind.ACTIVATION)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_module_hooks_in_c_write_what_the_python_hooks_wrote(tmp_path, name):
    native = scopes_and_meaning(tmp_path / "c.alsc", name, True)
    python = scopes_and_meaning(tmp_path / "py.alsc", name, False)
    scopes = native[0]
    assert scopes == python[0]
    assert native[1] == python[1]
    # Not vacuous: leaves' output bytes are there, and in the odd model some
    # leaves' bytes come from the Python fallback (tuple outputs, a subclass)
    # and some are 0 (the in-place ReLU, Flatten's view).
    exits = {(n, size) for k, n, _, size in scopes if k == EventKind.MODULE_EXIT}
    assert any(size > 0 for _, size in exits)
    if name == "odd":
        assert ("Odd.relu", 0) in exits and ("Odd.flat", 0) in exits
        assert any(n == "Odd.lstm" and size > 0 for n, size in exits)
        assert any(n == "Odd.bil" and size > 0 for n, size in exits)
