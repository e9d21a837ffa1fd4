"""Attribution on real captures of a watched model (tests/data/*_watch_v*.alsc,
one pair per format version, made by tests/data/make_fixtures.py; the CUDA
ones on the virtual GPU), checked on any machine."""

import glob
import json
import os

import numpy as np
import pytest

import allocscope
from allocscope import EventKind
from allocscope.attribution import attribute, moment, timeline
from allocscope.reports import build_report
from allocscope.reports.report import find_mark

from ..conftest import DATA

pytestmark = pytest.mark.torch_agnostic

FIXTURES = sorted(glob.glob(os.path.join(DATA, "*_watch_v*.alsc")))


@pytest.fixture(params=FIXTURES, ids=[os.path.basename(p) for p in FIXTURES])
def cap(request):
    return allocscope.load(request.param)


def test_the_cpu_fixture_exists():
    assert os.path.join(DATA, "cpu_watch_v1.alsc") in FIXTURES
    assert os.path.join(DATA, "cpu_watch_v2.alsc") in FIXTURES


def test_every_moment_adds_up(cap):
    att = attribute(cap)
    tl = timeline(att)
    marks = np.flatnonzero(cap.events.kind == EventKind.MARK)
    assert len(marks) == 6
    for label in [None] + [cap.label(i) for i in marks]:
        r = build_report(cap, at=label)
        focus = r["at"] if label else r["peak"]
        assert r["theory"]["total"] + sum(i["bytes"] for i in r["gap"]) == r["measured"]["total_bytes"]
        assert sum(focus["by_category"].values()) == focus["requested_bytes"] == tl.requested[focus["event"] + 1]


def test_parameters_and_optimizer_state_match_the_watched_model(cap):
    (w,) = [json.loads(cap.label(i)) for i in np.flatnonzero(cap.events.kind == EventKind.WATCH)]
    att = attribute(cap)
    for step in range(3):
        m = moment(att, find_mark(cap, f"step {step}"))
        assert m.by_category["parameter"] == w["parameters"]
        assert m.by_category["gradient"] == w["trainable"]  # before zero_grad
        # Adam: two moments per parameter, one step counter per parameter
        # tensor (4 B on the CPU; on CUDA the counters live on the host)
        n_tensors = 6  # conv, batch norm and linear: weight and bias each
        counters = 4 * n_tensors if att.device_type == "cpu" else 0
        assert m.by_category["optimizer_state"] == 2 * w["trainable"] + counters
    fwd = moment(att, find_mark(cap, "forward 1"))
    assert fwd.by_category["activation"] > 0 and fwd.by_category["input"] == 4 * 3 * 16 * 16 * 4
    assert [i["iteration"] for i in build_report(cap)["iterations"]] == [0, 1, 2, 3]


CUDA_FIXTURES = [p for p in FIXTURES if os.path.basename(p).startswith("cuda_")]


@pytest.mark.parametrize("path", CUDA_FIXTURES, ids=[os.path.basename(p) for p in CUDA_FIXTURES])
def test_cuda_totals_match_the_allocator(path):
    cap = allocscope.load(path)
    tl = timeline(attribute(cap))
    end = cap.baseline("end")
    stats = end["devices"][0]["stats"]
    assert tl.requested[-1] == stats["requested_bytes"]["current"]
    assert tl.reserved[-1] == stats["reserved_bytes"]["current"]
