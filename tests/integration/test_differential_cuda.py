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
    for w in started.values():
        w.close()


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
