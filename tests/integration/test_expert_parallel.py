"""Expert parallelism on virtual cards (tests/scripts/expert_parallel.py):
tokens dispatched to experts on other ranks with all_to_all_single, split
sizes exchanged first, as MoE layers do it by hand. How many tokens each
rank receives follows the routing chosen for routers whose logits were not
computed (docs/vgpu.md, "Values"); the virtual NCCL's all-to-all gives each
rank from every peer what it sends to itself."""

import json
import os
import sys

import pytest

import allocscope
from allocscope.allocator.recorded import recorded_reserved

from ..conftest import ROOT
from ..replay import assert_exact
from ..support.many_gpus import MARKS, allocscope_cli

SCRIPT = os.path.join(ROOT, "tests", "scripts", "expert_parallel.py")
TOKENS, TOP_K = 4096, 2

pytestmark = MARKS


@pytest.mark.parametrize("cards", [2, pytest.param(4, marks=pytest.mark.heavy)])
def test_balanced_routing_every_rank_receives_its_share_and_peaks_where_torch_says(tmp_path, cards):
    out = tmp_path / "out"
    out.mkdir()
    allocscope_cli(tmp_path, "run", "--gpu", f"{cards}xH100-80GB", "--routing", "balanced", "-o",
                   str(tmp_path / "ep.alsc"), "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(cards), SCRIPT, str(out))
    for rank in range(cards):
        said = json.loads((out / f"rank{rank}.json").read_text())
        assert said["received"] == [TOKENS * TOP_K] * 2  # every rank's picks spread over every rank's experts
        cap = allocscope.load(tmp_path / f"ep.rank{rank}.alsc")
        assert int(recorded_reserved(cap).max()) == said["max_memory_reserved"] == assert_exact(cap).peak_reserved


def test_worst_routing_sends_every_token_to_the_first_rank_and_fit_names_it_the_job_s_worst(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = allocscope_cli(tmp_path, "fit", "--gpu", "H100-80GB", "--routing", "worst", "--world-size", "4",
                       "--ranks", "0-3", "--json", "-o", str(tmp_path / "fit"), "--", SCRIPT, str(out))
    doc = json.loads(r.stdout)
    said = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)}
    # every token picks experts 0 and 1, both on rank 0
    assert said[0]["received"] == [4 * TOKENS * TOP_K] * 2 and all(said[r]["received"] == [0, 0] for r in (1, 2, 3))
    cards = {c["rank"]: c for c in doc["cards"]}
    assert all(cards[r]["peak_reserved_bytes"] == said[r]["max_memory_reserved"] for r in range(4))
    (job,) = doc["jobs"]
    assert job["worst_rank"] == 0 and cards[0]["peak_reserved_bytes"] > max(cards[r]["peak_reserved_bytes"]
                                                                           for r in (1, 2, 3))
