"""The OOM post-mortem on real out-of-memory errors (marked `cuda`: torch's
real caching allocator, on the virtual GPU or a GPU): workloads that run out
(tests/scripts/oom_workloads.py) are recorded, explained by the report, and
every "would it have avoided the OOM?" answer the post-mortem gives is
checked by running the workload again under that setting."""

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

import allocscope
from allocscope.allocator.replay import replay
from allocscope.reports.report import build_report

from ..conftest import ROOT
from ..support.environment import with_alloc_conf

pytestmark = pytest.mark.cuda

SCRIPT = os.path.join(ROOT, "tests", "scripts", "oom_workloads.py")


def run(workload, conf="", out=None):
    """Runs a workload in a fresh process under PYTORCH_CUDA_ALLOC_CONF=conf:
    {"oom": ..., "max_reserved": ...}."""
    env = with_alloc_conf(conf)
    args = [sys.executable, SCRIPT, workload] + ([str(out)] if out else [])
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{workload} ({conf or 'defaults'}) exited {proc.returncode}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


def postmortem(tmp_path, workload):
    path = tmp_path / f"{workload}.alsc"
    measured = run(workload, out=path)
    cap = allocscope.load(path)
    return cap, measured, build_report(cap)


def check_claims(workload, oom):
    """Each setting the post-mortem tried: the workload run again under it
    runs out exactly when the post-mortem says it would. Returns each run's
    result by setting. The runs are processes of their own, two at a time."""
    tried = oom["settings_tried"]
    assert tried
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        again = dict(zip([t["settings"] for t in tried], pool.map(lambda t: run(workload, t["settings"]), tried)))
    for t in tried:
        assert again[t["settings"]]["oom"] == (not t["avoids_oom"]), t
    return again


@pytest.mark.heavy
def test_too_large_a_batch(tmp_path):
    cap, measured, r = postmortem(tmp_path, "batch")
    assert measured["oom"]
    oom = r["oom"]
    assert oom["reproduced_by_replay"]
    assert oom["shortfall"] > 0
    # what filled the budget: the batch's activations and the model, nothing unknown
    cats = oom["filled_by"]["categories"]
    assert cats["activation"] > 0 and cats["parameter"] > 0 and cats["input"] > 0 and cats["unknown"] == 0
    assert not any(t["avoids_oom"] for t in oom["settings_tried"])  # no setting makes the batch fit
    check_claims("batch", oom)


@pytest.mark.heavy
def test_fragmentation_under_a_fraction(tmp_path):
    cap, measured, r = postmortem(tmp_path, "fragments")
    assert measured["oom"]
    oom = r["oom"]
    assert oom["reproduced_by_replay"]
    # 672 MiB cached in 12 MiB holes of segments still in use: none of it
    # could serve the 80 MiB request, and empty_cache() could not free it
    assert oom["cached_unusable"]["too_small"] == oom["allocator"]["cached_free"] > oom["shortfall"] > 0
    assert oom["allocator"]["largest_free_block"] < oom["request"]["size"]
    assert not oom["empty_cache_would_help"]
    avoids = {t["settings"] for t in oom["settings_tried"] if t["avoids_oom"]}
    assert "expandable_segments:True" in avoids
    again = check_claims("fragments", oom)
    # the prediction for the setting that avoids it, against the real run
    expandable = next(t for t in oom["settings_tried"] if t["settings"] == "expandable_segments:True")
    assert expandable["peak_reserved"] == again["expandable_segments:True"]["max_reserved"]


def test_a_pending_cross_stream_free_does_not_run_out(tmp_path):
    """A free that still waits for a busy side stream cannot cause an OOM
    outside graph capture: before it gives up, c10 synchronizes the pending
    events (synchronize_and_free_events) and reuses the memory. The replay
    follows that path exactly and predicts no OOM."""
    cap, measured, r = postmortem(tmp_path, "pending")
    assert not measured["oom"] and "oom" not in r
    ev = cap.events
    assert (ev.kind == allocscope.EventKind.FREE_COMPLETED).any()  # the free did wait
    rep = replay(cap)
    assert rep.fidelity.exact and not rep.ooms
    assert rep.peak_reserved == measured["max_reserved"]
