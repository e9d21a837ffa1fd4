"""NCCL's own device memory on the virtual GPU, held to a card's: the same
script (tests/scripts/nccl_stages.py, one rank under torchrun, backend nccl)
measured on an H100 by make gpu-check (tests/data/nccl_stages_h100.json) and
here on the virtual H100, stage by stage."""

import json
import os
import sys

from ..conftest import ROOT
from ..support.many_gpus import MARKS, allocscope_cli

pytestmark = MARKS

SCRIPT = os.path.join(ROOT, "tests", "scripts", "nccl_stages.py")
CARD = os.path.join(ROOT, "tests", "data", "nccl_stages_h100.json")
# A rank's point-to-point connection to itself costs 248 MiB on the card; the
# virtual NCCL does not model it (docs/vgpu.md, "NCCL's own memory").
NOT_MODELLED = {"batch_isend_irecv"}


def test_nccl_memory_outside_the_allocator_matches_the_card_stage_by_stage(tmp_path):
    with open(CARD) as f:
        card = {s["stage"]: s for s in json.load(f)["stages"]}
    allocscope_cli(tmp_path, "run", "--gpu", "H100-80GB", "--no-record", "--",
                   sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                   SCRIPT, str(tmp_path))
    with open(tmp_path / "rank0.json") as f:
        virtual = {s["stage"]: s for s in json.load(f)["stages"]}
    assert virtual.keys() == card.keys()
    compared = {name: (virtual[name].get("delta"), card[name].get("delta"))
                for name in card if name not in NOT_MODELLED}
    # the communicator's channels at init, NCCL's kernels once, a split communicator's channels, both given back
    assert compared["init_process_group"][1] > 0 and compared["new_group"][1] > 0
    assert all(v == c for v, c in compared.values()), compared
