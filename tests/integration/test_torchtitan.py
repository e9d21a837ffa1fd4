"""torchtitan's own train.py, unmodified, with its Llama 3 debug config and
FSDP2 x TP x PP on a 2 x 2 x 2 mesh (an optional extra: skipped where
torchtitan is not installed, as in CI; its wheel lacks the repository's
tests/assets, which tests/scripts/torchtitan_assets.py writes)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import allocscope
from allocscope.allocator.recorded import recorded_reserved

from ..conftest import ROOT
from ..support.many_gpus import MARKS, allocscope_cli

pytestmark = [*MARKS, pytest.mark.heavy]

ASSETS = os.path.join(ROOT, "tests", "scripts", "torchtitan_assets.py")

TRAIN = ["-m", "torchtitan.train", "--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", "2",
         # torchtitan refuses its default CUDA graphs with pipeline parallelism
         "--training.disable_cuda_graphs", "--parallelism.data_parallel_shard_degree", "2",
         "--parallelism.tensor_parallel_degree", "2", "--parallelism.pipeline_parallel_degree", "2"]


@pytest.fixture
def assets(tmp_path):
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed")
    # torchtitan follows torch's nightlies: 0.3.0 does not import on torch 2.11
    imported = subprocess.run([sys.executable, "-c", "import torchtitan.trainer"], capture_output=True, text=True,
                              timeout=300)
    if imported.returncode != 0:
        pytest.skip(f"torchtitan does not import on this torch: {imported.stderr.strip().splitlines()[-1]}")
    subprocess.run([sys.executable, ASSETS, str(tmp_path)], check=True, timeout=300)
    return tmp_path


def test_fsdp_tp_pp_one_rank_per_stage_fits_as_among_all_eight_processes(assets):
    tmp_path = assets
    allocscope_cli(tmp_path, "run", "--gpu", "8xH100-80GB", "-o", "all.alsc", "--", sys.executable, "-m",
                   "torch.distributed.run", "--standalone", "--nproc-per-node", "8", *TRAIN)
    everyone = {r: allocscope.load(tmp_path / f"all.rank{r}.alsc") for r in range(8)}
    assert all(cap.complete and not cap.warnings for cap in everyone.values())
    r = allocscope_cli(tmp_path, "fit", "--gpu", "H100-80GB", "--world-size", "8", "--ranks", "0,4", "--json",
                       "--", sys.executable, *TRAIN)
    doc = json.loads(r.stdout)
    cards = {c["rank"]: c for c in doc["cards"]}
    assert sorted(cards) == [0, 4] and doc["jobs"][0]["verdict"] == "fits"
    # interleaved 1F1B: two virtual stages per rank
    assert cards[0]["role"].startswith("stages 0, 2 of 4; pp 0/2")
    assert cards[4]["role"].startswith("stages 1, 3 of 4; pp 1/2")
    for rank, card in cards.items():
        assert card["verdict"] == "fits"
        assert card["peak_reserved_bytes"] == int(recorded_reserved(everyone[rank]).max())
    # the stages hold different layers: their peaks differ
    assert cards[0]["peak_allocated_bytes"] != cards[4]["peak_allocated_bytes"]
