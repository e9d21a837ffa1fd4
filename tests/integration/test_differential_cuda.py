"""The allocator model against torch's real caching allocator, on generated
request streams (tests/support/request_streams.py): each stream runs on the
CUDA device under the recorder, with one PYTORCH_CUDA_ALLOC_CONF setting, and
its capture is replayed; every segment event, block address, the end
snapshot, the peak reserved and every out-of-memory error must be the
recorded ones. hypothesis shrinks a failing stream to a minimal one.

CI runs ALLOCSCOPE_STREAMS streams per setting (default 30) with a fixed
seed; benchmarks/soak_replay.py runs many more with fresh seeds.
"""

from __future__ import annotations

import json
import os

import pytest

from ..support.request_streams import SETTINGS, Worker, programs, run_program

hypothesis = pytest.importorskip("hypothesis")

pytestmark = pytest.mark.cuda

STREAMS = int(os.environ.get("ALLOCSCOPE_STREAMS", "30"))

#: setting -> [streams, events, torch aborts rerun] checked in this session (conftest prints them)
CHECKED: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def workers():
    started: dict[str, Worker] = {}

    def get(setting: str) -> Worker:
        if setting not in started:
            started[setting] = Worker(SETTINGS[setting])
        return started[setting]

    yield get
    Worker.close_all(list(started.values()))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_replay_is_exact_on_generated_streams(setting, workers):
    from hypothesis import HealthCheck, given, settings

    worker = workers(setting)
    counts = CHECKED.setdefault(f"{setting} (torch {worker.torch})", [0, 0, 0])

    @settings(max_examples=STREAMS, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(programs(setting))
    def exact(program):
        problems, events = run_program(worker, program)
        counts[0] += 1
        counts[1] += events
        assert not problems, "\n".join(problems) + "\nstream: " + json.dumps(program)

    exact()
    counts[2] = len(worker.aborts)
    assert counts[0] >= STREAMS


def test_replay_learns_a_pool_map_grown_before_recording(workers, monkeypatch):
    """c10's map of freeable graph pools never shrinks: after a program had
    eight pools freeable at once, a later recording releases pools in the
    order of that larger map, which no capture shows. The replay learns its
    size from the recorded order of segment frees (private_pools.py)."""
    from ..support.request_streams import check

    worker = workers("defaults")
    graph = ["graph", [["alloc", 512, 0], ["free", 0]]]  # leaves one cached 2 MiB segment in its pool
    grow = [graph] * 8 + [["drop_graph", 0]] * 8 + [["empty_cache"]]
    # Pools a and a + 3 (a even), made freeable in that order, come out in
    # another order from a map of 4 buckets than from one of 16: the first
    # and fourth of five graphs, then the second and fifth (one pair starts
    # even, whatever ids the process has reached).
    later = [graph] * 5 + [["drop_graph", 0], ["drop_graph", 2], ["empty_cache"],
                           ["drop_graph", 0], ["drop_graph", 1], ["empty_cache"]]
    worker.restart()
    for program in (grow, later):
        path, measured = worker.run(program)
        problems, rep, _ = check(path, measured)
        assert not problems, "\n".join(problems)
    worker.restart()
    # a map of 4 buckets was enough for what the recording itself made
    assert max(dev.freeable.buckets for dev in rep.devices.values()) > 4
    from allocscope.allocator.recorded import SegmentChecker

    monkeypatch.setattr(SegmentChecker, "upcoming_frees", lambda self, n: [])  # without the rule
    problems, _, _ = check(path, measured)
    assert any("segment events" in p for p in problems)
