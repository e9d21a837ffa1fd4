"""Real CUDA captures (tests/data/cuda_*.alsc, recorded on a GPU by
tests/data/make_fixtures.py), checked on any machine: the events must carry
the start baseline exactly to the end baseline."""

import glob
import os

import pytest

import allocscope

from ..conftest import DATA
from ..replay import check_start_to_end

FIXTURES = sorted(glob.glob(os.path.join(DATA, "cuda_*.alsc")))


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.basename(p) for p in FIXTURES])
def test_events_carry_the_start_baseline_to_the_end_baseline(path):
    cap = allocscope.load(path)
    assert cap.complete and cap.metadata["devices_recorded"] == ["cuda"]
    check_start_to_end(cap)
