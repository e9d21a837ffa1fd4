"""The report's "serving" section (reports/serving.py) on a stand-in for a
serving engine: functions named and placed as vLLM's (a package folder
named vllm; `profile_run`, a KV cache allocation, `capture_model`), run
on the virtual GPU. Its figures against torch's own counters in the same
run: the profile run's peak over what it left, what capturing the graph
added to reserved memory, the graph's private pool; and the waterfall's
lines for the engine's own buffers and the graph pool's free memory."""

import json
import os
import subprocess
import sys

import pytest

import allocscope

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")

ENGINE = '''
import torch
from vllm.model_executor import layers

def profile_run():
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    y = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    del x, y

def allocate_kv_cache():
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

class InputBuffers:  # (the engine's own, made outside the model)
    def __init__(self):
        self.block_tables = torch.zeros(3 << 20, dtype=torch.uint8, device="cuda")
        self.positions = torch.zeros(1250, dtype=torch.int32, device="cuda")

def capture_model():
    torch.cuda.empty_cache()  # (vLLM's does, before it reads the free memory)
    static = torch.zeros(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = layers.forward(static)
    return g, static, out
'''

MAIN = '''
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from vllm import runner
from vllm.model_executor import layers
weights = layers.create_weights()
buffers = runner.InputBuffers()
torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_allocated()
runner.profile_run()
peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
kv = runner.allocate_kv_cache()
torch.cuda.empty_cache()
reserved = torch.cuda.memory_reserved()
graph = runner.capture_model()
captured = torch.cuda.memory_reserved() - reserved
in_pools = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) != (0, 0)]
pools = sum(s["total_size"] for s in in_pools)
pools_free = pools - sum(s["allocated_size"] for s in in_pools)
print(json.dumps({"activation": peak - after, "captured": captured, "pools": pools, "pools_free": pools_free,
                  "allocated": torch.cuda.memory_allocated()}))
'''


@pytest.mark.parametrize("settings", ["", "expandable_segments:True"])
def test_a_serving_engines_profile_graphs_and_kv_cache_as_torch_counts_them(tmp_path, settings):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / "vllm" / "runner.py").write_text(ENGINE)
    (tmp_path / "vllm" / "model_executor").mkdir()
    (tmp_path / "vllm" / "model_executor" / "__init__.py").write_text("")
    (tmp_path / "vllm" / "model_executor" / "layers.py").write_text(
        "import torch\n\ndef create_weights():\n    return torch.empty(8 << 20, dtype=torch.uint8, device='cuda')\n"
        "\ndef forward(x):\n    return x * 2\n")
    (tmp_path / "main.py").write_text(MAIN)
    out = tmp_path / "engine.alsc"
    run = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "L4-24GB", "-o", str(out), "--",
                          sys.executable, str(tmp_path / "main.py"), str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=settings))
    assert run.returncode == 0, run.stderr[-3000:]
    torch_says = json.loads(run.stdout.strip().splitlines()[-1])
    doc = subprocess.run([sys.executable, "-m", "allocscope", "report", "--json", str(out)], capture_output=True,
                         text=True, timeout=600)
    assert doc.returncode == 0, doc.stderr[-3000:]
    report = json.loads(doc.stdout)
    serving = report["serving"]
    assert serving["engine"] == "vllm"
    assert serving["profile_run"]["peak_activation_bytes"] == torch_says["activation"] == 96 << 20
    assert serving["capture_model"]["reserved_bytes"] == torch_says["captured"] > 0
    assert serving["graph_pool_bytes"] == torch_says["pools"] > 0
    assert serving["kv_cache_bytes"] == report["kv_cache"]["bytes"] == 256 << 20
    # the waterfall, at the peak of allocated memory (the end: the graph's output was the last allocation)
    assert report["peak"]["allocated_bytes"] == torch_says["allocated"]
    gap = {g["item"]: g for g in report["gap"]}
    by_category = report["peak"]["by_category"]
    # the engine's: its buffers and the graph's static input; not the weights or the graph's output (the model's)
    # (torch 2.11's graph capture also allocates its generator's seed and offset, 16 bytes, in the engine's call)
    assert by_category["engine"] == gap["engine_buffers"]["bytes"]
    assert 0 <= by_category["engine"] - ((3 << 20) + 5000 + (4 << 20)) <= 16
    assert by_category["kv_cache"] == 256 << 20 and by_category["other"] == (8 << 20) + (4 << 20)
    assert gap["graph_pools"]["bytes"] == torch_says["pools_free"] > 0
    text = subprocess.run([sys.executable, "-m", "allocscope", "report", str(out)], capture_output=True, text=True,
                          timeout=600).stdout
    assert "vLLM, measured" in text and "96.00 MiB (profile run)" in text
