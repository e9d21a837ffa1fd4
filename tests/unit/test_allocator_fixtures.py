"""The caching-allocator model on real CUDA captures (tests/data/cuda_*.alsc,
recorded on a GPU by tests/data/make_fixtures.py): replayed with the recorded
settings it must reproduce every recorded segment event, hand out every block
at its recorded address and end in the end baseline's exact state; and its
prediction for expandable segments must match a real run with them."""

import glob
import os

import pytest

import allocscope
from allocscope.allocator.config import parse_alloc_conf
from allocscope.allocator.recorded import recorded_reserved
from allocscope.allocator.replay import replay

from ..conftest import DATA

pytestmark = pytest.mark.torch_agnostic

FIXTURES = sorted(glob.glob(os.path.join(DATA, "cuda_*.alsc")))


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.basename(p) for p in FIXTURES])
def test_replay_reproduces_the_recording(path):
    cap = allocscope.load(path)
    rep = replay(cap)
    f = rep.fidelity
    assert f.first_mismatch is None, f.first_mismatch
    assert f.matched == f.recorded_segment_events
    assert f.address_mismatches == 0
    assert f.end_snapshot is None or f.end_snapshot["equal"], f.end_snapshot
    assert rep.peak_reserved == int(recorded_reserved(cap).max())


FRAGMENT = os.path.join(DATA, "cuda_fragment_v1.alsc")
EXPANDABLE = os.path.join(DATA, "cuda_fragment_expandable_v1.alsc")


@pytest.mark.skipif(not (os.path.exists(FRAGMENT) and os.path.exists(EXPANDABLE)),
                    reason="needs the GPU-recorded fragment fixtures (tests/data/make_fixtures.py --allocator)")
def test_expandable_prediction_matches_the_real_run():
    predicted = replay(allocscope.load(FRAGMENT), parse_alloc_conf("expandable_segments:True")).peak_reserved
    measured = int(recorded_reserved(allocscope.load(EXPANDABLE)).max())
    assert abs(predicted - measured) <= 0.02 * measured, (predicted, measured)
