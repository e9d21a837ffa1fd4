"""Allocations c10 serves past its cache (`torch.cuda.caching_allocator_enable(False)`,
as PyTorch's own test_cachingAllocator_raw_alloc does): a cudaMalloc of their
own, in no segment. The recorder marks their ALLOC (block = size), records
their free although c10's deleter for them reports none, and the replay
serves neither. On the virtual GPU, against the recorded segment events (the conformance run found these
captures replayed inexactly)."""

import json
import subprocess
import sys

import pytest

import allocscope
from allocscope.allocator.replay import replay
from allocscope.attribution.lifetimes import lifetimes
from allocscope.capture.format import EventKind

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")

MiB = 1 << 20
SCRIPT = """
import json, torch
MiB = 1 << 20
kept = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")          # cached: a segment
torch.cuda.caching_allocator_enable(False)
stats = torch.cuda.memory_stats()["requested_bytes.all.allocated"]
raw = torch.cuda.caching_allocator_alloc(5 * MiB)                       # past the cache
tensor = torch.empty(7 * MiB, dtype=torch.uint8, device="cuda")         # past the cache
uncounted = torch.cuda.memory_stats()["requested_bytes.all.allocated"] - stats
torch.cuda.caching_allocator_delete(raw)
del tensor
torch.cuda.caching_allocator_enable(True)
again = torch.empty(9 * MiB, dtype=torch.uint8, device="cuda")          # cached again
del again
print(json.dumps({"uncounted": uncounted}))
"""


def test_allocations_past_the_cache_are_marked_freed_and_not_replayed(tmp_path):
    out = tmp_path / "uncached.alsc"
    run = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "L4-24GB", "-o", str(out), "--",
                          sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert said["uncounted"] == 0  # c10 counts none of them, recorded or not

    cap = allocscope.load(out)
    ev = cap.events
    alloc = ev.kind == EventKind.ALLOC
    sizes = {int(s): int(b) for s, b in zip(ev.size[alloc].tolist(), ev.block[alloc].tolist(), strict=True)
             if s in (3 * MiB, 5 * MiB, 7 * MiB, 9 * MiB)}
    # the two past the cache carry their size as their block; the cached ones none
    assert sizes == {3 * MiB: 0, 5 * MiB: 5 * MiB, 7 * MiB: 7 * MiB, 9 * MiB: 0}
    lt = lifetimes(ev)
    freed = {int(ev.size[a]): int(f) >= 0 for a, f in zip(lt.alloc.tolist(), lt.free.tolist(), strict=True)}
    assert freed[5 * MiB] and freed[7 * MiB] and freed[9 * MiB] and not freed[3 * MiB]

    fidelity = replay(cap).fidelity.to_json()
    assert fidelity["exact"], fidelity["first_mismatch"]
    assert replay(cap, engine="python").fidelity.exact  # the reference model too
