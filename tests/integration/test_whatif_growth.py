"""How large an allocation could have been on a card (allocator/whatif.py's
largest_total: fit's KV cache that fills the card), against torch's real
caching allocator on the virtual GPU: the program run again with the
answer fits, and with one MiB more runs out of memory. What comes after
the grown allocation decides (segment sizes, fragmentation, cached
segments given back under pressure), so the answer is not the headroom at
the peak."""

import json
import subprocess
import sys

import pytest

import allocscope
from allocscope.allocator.whatif import largest_total
from allocscope.capture.baselines import closing_baseline, device_readings, outside_at_peak
from allocscope.capture.format import EventKind

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")

MiB = 1 << 20

# A cache sized first, then the rest of the program: blocks of sizes that
# take 2 and 20 MiB segments, some freed (cached), a segment of its own
# freed whole, and a request that only a fresh segment can serve: on the
# card the peak holds both segments; short of memory, c10 gives the cached
# one back and retries.
SCRIPT = """
import json, sys
import torch
MiB = 1 << 20
cache = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
if sys.argv[2] == "rounding":  # (changed at run time, as vLLM changes max_split_size_mb around its weights)
    torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:1")
kept = [torch.empty(3 * MiB + 1000 * i, dtype=torch.uint8, device="cuda") for i in range(6)]
small = [torch.empty(300 << 10, dtype=torch.uint8, device="cuda") for _ in range(9)]
del kept[1::2], small[::2]
scratch = torch.empty(50 * MiB, dtype=torch.uint8, device="cuda")
del scratch
tail = torch.empty(60 * MiB, dtype=torch.uint8, device="cuda")
print(json.dumps({"reserved": torch.cuda.memory_reserved()}))
"""


def run(tmp_path, cache_bytes, name, settings):
    out = tmp_path / f"{name}.alsc"
    p = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "L4-24GB:1GiB", "-o", str(out), "--",
                        sys.executable, "-c", SCRIPT, str(cache_bytes), settings], capture_output=True, text=True,
                       timeout=600)
    return p, out


@pytest.mark.parametrize("settings", ["recorded", "rounding"])
def test_the_largest_allocation_the_replay_allows_is_the_largest_the_allocator_serves(tmp_path, settings):
    p, out = run(tmp_path, 300 * MiB, "first", settings)
    assert p.returncode == 0, p.stderr[-3000:]
    cap = allocscope.load(out)
    ev = cap.events
    first = int(next(i for i in range(len(ev)) if ev.kind[i] == EventKind.ALLOC and ev.size[i] == 300 * MiB))
    device = next(d for d in device_readings(cap)["devices"] if "total" in d)
    capacity = int(device["total"]) - outside_at_peak(closing_baseline(cap))
    peak = int(json.loads(p.stdout.strip().splitlines()[-1])["reserved"])
    largest = largest_total(cap, [first], capacity=capacity, upper=capacity)
    assert largest is not None and largest % MiB == 0
    # more than the headroom at the peak: the cached segment is given back under pressure
    assert largest > 300 * MiB + (capacity - peak)
    fits, _ = run(tmp_path, largest, "fits", settings)
    assert fits.returncode == 0, fits.stderr[-3000:]
    over, _ = run(tmp_path, largest + MiB, "over", settings)
    assert over.returncode != 0 and "OutOfMemoryError" in over.stderr
    if settings == "recorded":
        # the recorded run itself needs all but the cached segment of its peak: short of that, no answer
        assert largest_total(cap, [first], capacity=peak - 50 * MiB, upper=capacity) == 300 * MiB
        assert largest_total(cap, [first], capacity=peak - 64 * MiB, upper=capacity) is None
