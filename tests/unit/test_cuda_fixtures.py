"""Real CUDA captures, checked on any machine: tests/data/cuda_*.alsc
(recorded by tests/data/make_fixtures.py on the virtual GPU, torch's real
caching allocator) and tests/data/<gpu>_torch<version>/cuda_*.alsc (the same
workloads recorded on a physical GPU by `make gpu-check`). The events must
carry the start baseline exactly to the end baseline, the replay must
reproduce what the allocator did, and the report's waterfall must add up."""

import glob
import os

import pytest

import allocscope
from allocscope.allocator.replay import replay
from allocscope.reports.report import analyse, build_report

from ..conftest import DATA
from ..replay import check_start_to_end

pytestmark = pytest.mark.torch_agnostic

FIXTURES = sorted(glob.glob(os.path.join(DATA, "cuda_*.alsc")) + glob.glob(os.path.join(DATA, "*", "cuda_*.alsc")))
IDS = [os.path.relpath(p, DATA) for p in FIXTURES]


def test_physical_gpu_captures_are_present():
    assert any(os.sep in i for i in IDS), "no capture from a physical GPU under tests/data/*/"


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_events_carry_the_start_baseline_to_the_end_baseline(path):
    cap = allocscope.load(path)
    assert cap.complete and cap.metadata["devices_recorded"] == ["cuda"]
    check_start_to_end(cap)


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_replay_reproduces_the_recorded_allocator(path):
    cap = allocscope.load(path)
    r = replay(cap)
    assert r.fidelity.exact, r.fidelity
    an = analyse(cap)
    assert an.att.blocks_exact
    report = build_report(cap, analysis=an)
    assert report["theory"]["total"] + sum(i["bytes"] for i in report["gap"]) == report["measured"]["total_bytes"]
