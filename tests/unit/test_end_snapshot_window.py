"""The end baseline's snapshot is taken while other threads may still free:
the replay's comparison with it looks at the last few states, not only the
last (allocator.recorded.settle_end_snapshot), on a capture in which the
autograd engine's thread freed a block after the snapshot."""

import os

import pytest

import allocscope
from allocscope.allocator.replay import replay

pytestmark = pytest.mark.torch_agnostic

PATH = os.path.join(os.path.dirname(__file__), "..", "data", "races", "oom_late_engine_free_v2.alsc")


@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_free_after_the_end_snapshot_still_replays_exactly(engine):
    cap = allocscope.load(PATH)
    n, seq = len(cap.events), cap.baseline("end")["seq"]
    late = [i for i in range(seq, n) if cap.events.kind[i] == allocscope.EventKind.FREE]
    assert late and cap.threads[int(cap.events.thread[late[0]])].name.startswith("pt_autograd")
    f = replay(cap, engine=engine).fidelity
    assert f.exact and f.end_snapshot["equal"]
    assert f.end_snapshot["after_event"] == late[0] - 1  # the state just before the engine's late free


def test_the_window_adds_no_state_that_was_not_asked_for():
    cap = allocscope.load(PATH)
    assert sorted(replay(cap, states_at=[10, len(cap.events) - 2]).states) == [10, len(cap.events) - 2]
    assert replay(cap).states == {}
