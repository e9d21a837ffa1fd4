"""A process killed before recording stopped (vLLM's API server SIGKILLs
its engine core) leaves no end baseline: the replay bounds its device by
the last baseline that read it (capture/baselines.closing_baseline), so
that where the program needed the allocator to give cached segments back,
the replay gives them back too. On the virtual GPU, against the recorded
segment events."""

import subprocess
import sys

import pytest

import allocscope
from allocscope.allocator.replay import replay

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")

SCRIPT = """
import os, signal, time
import torch
MiB = 1 << 20
torch.zeros(1, device="cuda")
# (a settings change: a baseline that reads the device, as vLLM's weights loading makes)
torch._C._accelerator_setAllocatorSettings("max_split_size_mb:20")
torch._C._accelerator_setAllocatorSettings("")
cached = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
del cached
big = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")  # only once the cached segment is given back
time.sleep(2)  # (the writer writes what was recorded)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_processs_replay_gives_back_cached_segments_where_the_allocator_did(tmp_path):
    out = tmp_path / "killed.alsc"
    subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "L4-24GB:1GiB", "-o", str(out), "--",
                    sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    cap = allocscope.load(out, salvage=True)
    assert cap.baseline("end") is None

    fidelity = replay(cap).fidelity.to_json()
    assert fidelity["exact"], fidelity["first_mismatch"]
