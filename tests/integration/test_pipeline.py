"""Pipeline parallelism (torch.distributed.pipelining) on virtual cards: the
stages exchange their shapes with send_object_list/recv_object_list, which
allocscope carries between the processes of a run (vgpu/objects.py), with
torch's own signatures. Each stage records, replays exactly, and peaks
where torch says, as the model's split says."""

import json
import os
import sys

import pytest

import allocscope
from allocscope.allocator.recorded import recorded_reserved

from ..conftest import ROOT
from ..replay import assert_exact
from ..support.many_gpus import MARKS, allocscope_cli

SCRIPT = os.path.join(ROOT, "tests", "scripts", "pipeline.py")

pytestmark = MARKS

SCHEDULES = ["gpipe", "interleaved1f1b"] + [pytest.param(s, marks=pytest.mark.heavy) for s in (
    "1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev")]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stages_record_replay_exactly_and_peak_where_torch_says(tmp_path, schedule):
    """Two ranks: one stage each (gpipe, 1f1b) or two (the looped and V-shaped schedules)."""
    out = tmp_path / "out"
    out.mkdir()
    allocscope_cli(tmp_path, "run", "--gpu", "2xH100-80GB", "-o", str(tmp_path / "pp.alsc"), "--", sys.executable,
                "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT, schedule, str(out))
    peaks = []
    for rank in (0, 1):
        said = json.loads((out / f"rank{rank}.json").read_text())
        cap = allocscope.load(tmp_path / f"pp.rank{rank}.alsc")
        rep = assert_exact(cap)
        assert int(recorded_reserved(cap).max()) == said["max_memory_reserved"] == rep.peak_reserved
        assert said["optimizer_states"] == 4 * len(said["stages"])  # every stage ran its backward and its step
        # every stage but the first built its input buffers from its sender's shapes (microbatches of 256
        # rows), which reached it through the objects
        assert said["received"] == [[256, 1024]] * len([s for s in said["stages"] if s != 0])
        peaks.append(said["max_memory_reserved"])
    assert peaks[0] > peaks[1]  # rank 0 holds the first stage, four times as wide


def test_the_object_calls_take_every_argument_torchs_own_take(tmp_path):
    """Each patched call passes all of torch's own parameters by keyword (a
    later torch's too: 2.14 added use_batch and weights_only) without a
    TypeError; here, without a process group, torch's own error comes back."""
    code = ("import inspect, torch.distributed as dist, torch.distributed.distributed_c10d as c10d\n"
            "assert c10d._allocscope_patched\n"
            "for name in ('send_object_list', 'recv_object_list', 'all_gather_object', 'gather_object',\n"
            "             'broadcast_object_list', 'scatter_object_list'):\n"
            "    f = getattr(dist, name)\n"
            "    assert f is not f.__wrapped__ and f is getattr(c10d, name), name\n"
            "    params = inspect.signature(f.__wrapped__).parameters.values()\n"
            "    kwargs = {p.name: [None] if p.default is inspect.Parameter.empty else p.default for p in params}\n"
            "    try:\n"
            "        f(**kwargs)\n"
            "    except TypeError:\n"
            "        raise\n"
            "    except Exception as e:\n"
            "        print(name, type(e).__name__)\n")
    r = allocscope_cli(tmp_path, "run", "--gpu", "H100-80GB", "--no-record", "--", sys.executable, "-c", code)
    assert len(r.stdout.splitlines()) == 6, r.stdout  # each ended in torch's own error, none in a TypeError


def test_one_rank_per_stage_of_a_job_of_64_together_peaks_as_the_stages_of_a_4_process_pipeline(tmp_path):
    """A job of 64 ranks on a ("pp", "dp") mesh of 4 x 16: its four stages' first ranks run together under fit
    (--ranks 0:64:16), the 60 others faked; each peaks as the same stage of a 4-process pipeline with the same
    stage shapes, received its input's shape from the stage before it (through the objects), and is named by
    its role; the job's verdict is its worst rank's."""
    four, job = tmp_path / "four", tmp_path / "job"
    four.mkdir()
    job.mkdir()
    allocscope_cli(tmp_path, "run", "--gpu", "4xH100-80GB", "--no-record", "--", sys.executable, "-m",
                   "torch.distributed.run", "--standalone", "--nproc-per-node", "4", SCRIPT, "gpipe", str(four), "4")
    r = allocscope_cli(tmp_path, "fit", "--gpu", "H100-80GB", "--world-size", "64", "--ranks", "0:64:16", "--json",
                       "-o", str(tmp_path / "fit"), "--", SCRIPT, "gpipe", str(job), "4")
    doc = json.loads(r.stdout)
    cards = {c["rank"]: c for c in doc["cards"]}
    assert sorted(cards) == [0, 16, 32, 48] and doc["world_size"] == 64
    for stage, rank in enumerate((0, 16, 32, 48)):
        alone_of_four = json.loads((four / f"rank{stage}.json").read_text())
        said = json.loads((job / f"rank{rank}.json").read_text())
        assert said["stages"] == [stage] and said["received"] == ([[256, 1024]] if stage else [])
        assert said["max_memory_reserved"] == alone_of_four["max_memory_reserved"] == cards[rank]["peak_reserved_bytes"]
        assert cards[rank]["role"] == f"stage {stage} of 4; pp {stage}/4, dp 0/16"
    assert cards[0]["peak_reserved_bytes"] > cards[48]["peak_reserved_bytes"]  # the first stage is the widest
    (jobs,) = doc["jobs"]
    worst = min(doc["cards"], key=lambda c: c["headroom_bytes"])
    assert jobs["worst_rank"] == worst["rank"] and jobs["worst_role"] == worst["role"]
