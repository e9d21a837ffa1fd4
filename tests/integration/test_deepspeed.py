"""DeepSpeed ZeRO-3 (an optional extra: skipped where deepspeed is not
installed, as in CI) as ranks of a larger job: ZeRO-3 checks that its ranks
agree by broadcasting from rank 0, which a rank other than 0 hears from rank
0 run beside it (docs/vgpu.md, "One rank of a large job")."""

import json
import os
import sys

import pytest

from ..conftest import ROOT
from ..support.many_gpus import MARKS, allocscope_cli

SCRIPT = os.path.join(ROOT, "tests", "scripts", "zero3.py")

pytestmark = [*MARKS, pytest.mark.heavy]


def test_zero3_ranks_alone_and_together_peak_as_among_all_the_processes(tmp_path):
    pytest.importorskip("deepspeed")
    runs = {}
    for name, args in (("all", ["--gpu", "4xH100-80GB", "--", sys.executable, "-m", "torch.distributed.run",
                                "--standalone", "--nproc-per-node", "4", SCRIPT]),
                       ("rank0", ["--gpu", "H100-80GB", "--world-size", "4", "--rank", "0", "--", SCRIPT]),
                       ("rank1", ["--gpu", "H100-80GB", "--world-size", "4", "--rank", "1", "--", SCRIPT]),
                       ("together", ["--gpu", "H100-80GB", "--world-size", "4", "--ranks", "0,3", "--", SCRIPT])):
        out = tmp_path / name
        out.mkdir()
        allocscope_cli(tmp_path, "run", "--no-record", *args[:-1], args[-1], str(out))
        runs[name] = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    assert sorted(runs["all"]) == [0, 1, 2, 3] and sorted(runs["together"]) == [0, 3]
    peak = {rank: said["max_memory_reserved"] for rank, said in runs["all"].items()}
    assert runs["rank0"][0]["max_memory_reserved"] == peak[0]
    # rank 1 passed ZeRO-3's checks: rank 0 ran beside it (and wrote its own file, as the script does)
    assert runs["rank1"][1]["max_memory_reserved"] == peak[1]
    assert all(runs["together"][r]["max_memory_reserved"] == peak[r] for r in (0, 3))
