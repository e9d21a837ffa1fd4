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
