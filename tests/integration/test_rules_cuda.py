"""The rules allocscope's Python shares with c10's C++, held to torch's real
caching allocator (virtual GPU or hardware): the rounding of requests
(allocator/sizes.py round_size) and the parsing of PYTORCH_CUDA_ALLOC_CONF
(allocator/config.py parse_alloc_conf, against the settings c10 reports in
a capture's baseline)."""

import json
import random

import pytest

import allocscope
from allocscope.allocator.config import parse_alloc_conf, recorded_config
from allocscope.allocator.sizes import MIN_BLOCK, MIN_LARGE_ALLOC, MiB, round_size

from ..conftest import run_python
from ..support.environment import with_alloc_conf

pytestmark = pytest.mark.cuda

# Each request alone in a fresh segment (empty_cache first), below the size
# whose segment is cut to fit it: c10 splits the block to the rounded size,
# so allocated_bytes grows by exactly round_size.
MEASURE = r"""
import json, sys
import torch
import allocscope
sizes = json.loads(sys.argv[1])
torch.cuda.init()
with allocscope.record(sys.argv[2], device="cuda", stacks="none"):
    blocks = []
    for n in sizes:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_stats()["allocated_bytes.all.current"]
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        blocks.append(torch.cuda.memory_stats()["allocated_bytes.all.current"] - before)
        del t
print(json.dumps(blocks))
"""

SETTINGS = ["", "roundup_power2_divisions:4", "roundup_power2_divisions:[1:2,2:8,4:4,>:1]",
            "max_split_size_mb:64,roundup_power2_divisions:2"]


def _sizes(seed: int) -> list[int]:
    rng = random.Random(seed)
    edges = [1, MIN_BLOCK - 1, MIN_BLOCK, MIN_BLOCK + 1, MiB - 1, MiB, MiB + 1, 2 * MiB, 2 * MiB + 1, 4 * MiB + 3]
    return edges + [rng.randrange(1, MIN_LARGE_ALLOC) for _ in range(40)]


@pytest.mark.parametrize("settings", SETTINGS)
def test_round_size_and_settings_agree_with_c10(tmp_path, settings):
    sizes = _sizes(len(settings))
    env = with_alloc_conf(settings)
    path = tmp_path / "rules.alsc"
    out = run_python(MEASURE, json.dumps(sizes), str(path), env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    blocks = json.loads(out.stdout.split("\n")[-2])
    cap = allocscope.load(path)
    ours = parse_alloc_conf(settings)
    # c10's own reading of the string, as the recorder wrote it in the baseline
    theirs = cap.baseline("start")["config"]
    assert tuple(theirs["roundup_power2_divisions"]) == ours.roundup_power2_divisions
    assert int(theirs["max_split_size"]) == ours.max_split_size
    assert recorded_config(cap.baseline("start"), cap.metadata) == ours
    assert [round_size(n, ours.roundup_power2_divisions) for n in sizes] == blocks
    if any(ours.roundup_power2_divisions):  # the sizes tell the settings apart
        assert [round_size(n) for n in sizes] != blocks
    print(f"{settings or 'defaults'}: {len(sizes)} sizes, c10 and round_size agree")
