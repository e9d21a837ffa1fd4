"""What a watch checks each step, in C++ (csrc/recorder/fingerprints.h):
whether the model's parameters moved and whether an optimizer's state holds
new tensors. (The optimizer's side in a watch: test_attribution_cpu's
test_optimizer_state_made_anew_each_step_is_named_each_step.)"""

import gc
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import allocscope
from allocscope import EventKind
from allocscope.common.native import native


def test_changes_compares_what_the_last_call_read():
    changes = native().Changes()
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    a = first.weight
    refs = [(weakref.ref(first), "weight"), (weakref.ref(second), "bias")]
    assert changes.addresses(refs)  # the first look
    assert not changes.addresses(refs)
    with torch.no_grad():
        a.set_(torch.zeros(8).untyped_storage())  # moved
    assert changes.addresses(refs)
    assert not changes.addresses(refs)
    first.weight = nn.Parameter(torch.zeros(2, 2))  # another parameter in its place
    assert changes.addresses(refs)
    assert not changes.addresses(refs)
    del second
    gc.collect()
    assert changes.addresses(refs)  # gone: 0
    assert not changes.addresses(refs)
    assert changes.addresses(refs[:1])  # fewer
    assert weakref.getweakrefcount(first.weight) == 0  # (swap_tensors refuses a tensor with one)
    with pytest.raises(TypeError, match="module, parameter name"):
        changes.addresses([weakref.ref(a)])

    state = {"p": {"step": 1, "exp_avg": a}}
    assert changes.values(state) and not changes.values(state)
    state["p"]["exp_avg"] = torch.zeros(4)  # another object
    assert changes.values(state) and not changes.values(state)
    state["q"] = {}  # (a new parameter without state yet: no value)
    assert not changes.values(state)


def test_moved_parameters_are_labelled_again(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    with allocscope.record(tmp_path / "m.alsc", device="cpu") as rec:
        rec.watch(model)
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))  # nothing moved: nothing labelled
        model.double()  # new storages
        model(torch.randn(2, 8, dtype=torch.float64))
    cap = allocscope.load(tmp_path / "m.alsc")
    ev = cap.events
    labels = [(cap.strings[int(ev.arg[i])], int(ev.addr[i])) for i in np.flatnonzero(ev.kind == EventKind.PARAMETER)]
    names = [n for n, _ in labels]
    assert names == ["Sequential.0.weight", "Sequential.0.bias", "Sequential.1.weight", "Sequential.1.bias"] * 2
    assert labels[4][1] == model[0].weight.data_ptr() and labels[0][1] != labels[4][1]
