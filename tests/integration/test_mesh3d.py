"""A Llama-shaped model on a 3-D DeviceMesh as torchtitan builds it (tests/scripts/mesh3d.py): 1F1B pipeline
parallel over "pp", FSDP2 over "dp", tensor parallel with sequence parallel over "tp", on virtual cards."""

import json
import os
import sys

import pytest

from ..conftest import ROOT
from ..support.many_gpus import MARKS, allocscope_cli

SCRIPT = os.path.join(ROOT, "tests", "scripts", "mesh3d.py")

pytestmark = MARKS


def fit_ranks(tmp_path, world, ranks, pp, dp, tp):
    out = tmp_path / "out"
    out.mkdir()
    r = allocscope_cli(tmp_path, "fit", "--gpu", "H100-80GB", "--world-size", str(world), "--ranks", ranks, "--json",
                       "-o", str(tmp_path / "fit"), "--", SCRIPT, str(out), str(pp), str(dp), str(tp))
    return json.loads(r.stdout), out


def test_one_rank_per_stage_of_a_job_of_64_fits_each_named_by_its_coordinates(tmp_path):
    doc, out = fit_ranks(tmp_path, 64, "0:64:16", 4, 8, 2)
    assert doc["world_size"] == 64 and doc["jobs"][0]["verdict"] == "fits"
    for stage, card in enumerate(sorted(doc["cards"], key=lambda c: c["rank"])):
        said = json.loads((out / f"rank{card['rank']}.json").read_text())
        assert said["stage"] == stage and card["peak_reserved_bytes"] == said["max_memory_reserved"]
        assert card["role"] == f"stage {stage} of 4; pp {stage}/4, dp 0/8, tp 0/2"


@pytest.mark.heavy
def test_the_stages_together_peak_as_the_same_ranks_of_eight_processes(tmp_path):
    """2 x 2 x 2: ranks 0 and 4 (one per stage) together, the six others faked, against all eight under torchrun."""
    everyone = tmp_path / "all"
    everyone.mkdir()
    allocscope_cli(tmp_path, "run", "--gpu", "8xH100-80GB", "--no-record", "--", sys.executable, "-m",
                   "torch.distributed.run", "--standalone", "--nproc-per-node", "8", SCRIPT, str(everyone), "2", "2", "2")
    doc, out = fit_ranks(tmp_path, 8, "0,4", 2, 2, 2)
    for card in doc["cards"]:
        torch_says = json.loads((everyone / f"rank{card['rank']}.json").read_text())
        assert card["peak_reserved_bytes"] == torch_says["max_memory_reserved"]
        assert json.loads((out / f"rank{card['rank']}.json").read_text()) == torch_says
