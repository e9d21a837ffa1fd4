"""vLLM, unmodified, on the virtual GPU (make test-serving: vLLM in a venv of
its own, with the torch it pins): examples/vllm_generate.py, `LLM(...)` on a
Llama-style model with dummy weights, under `allocscope fit`. The engine
starts, profiles, sizes and allocates its KV cache, captures its CUDA
graphs and serves; allocscope's KV cache is the one vLLM logs, token for
token, and the engine process's capture replays exactly."""

import json
import re
import subprocess
import sys

import pytest

from ..conftest import ROOT

pytestmark = [pytest.mark.serving, pytest.mark.heavy]
vllm = pytest.importorskip("vllm")

SCRIPT = f"{ROOT}/examples/vllm_generate.py"
MODEL = ["--layers", "2", "--hidden", "512", "--intermediate", "1024", "--heads", "8", "--kv-heads", "2",
         "--vocab", "4096", "--max-model-len", "1024", "--requests", "3", "--max-tokens", "6"]


def fit(tmp_path, gpu, *options):
    out = tmp_path / f"fit{len(list(tmp_path.glob('fit*')))}"
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", gpu, "--json", "-o", str(out), "--",
                        sys.executable, SCRIPT, *MODEL, *options], capture_output=True, text=True, timeout=900,
                       cwd=tmp_path)
    log = (out / f"{gpu.replace(':', '-')}.log").read_text()
    assert p.returncode == 0, log[-4000:]
    said = json.loads([line for line in log.splitlines() if line.startswith("{\"num_gpu_blocks\"")][-1])
    return json.loads(p.stdout)["cards"][0], log, said


@pytest.mark.parametrize("gpu, eager", [("L4-24GB", True), ("L4-24GB", False), ("H100-80GB", False)])
def test_the_engine_serves_and_its_kv_cache_is_the_one_vllm_logs(tmp_path, gpu, eager):
    card, log, said = fit(tmp_path, gpu, *(["--enforce-eager"] if eager else []))
    assert card["verdict"] == "fits" and said["generated_tokens"] == [6, 6, 6]
    logged = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))
    assert logged == said["num_gpu_blocks"] * said["block_size"]
    assert card["kv_cache"]["tokens"] == logged
    assert card["kv_cache"]["shape"]["bytes_per_token"] == 2 * 2 * 2 * 64 * 2
    assert ("Capturing CUDA graphs" in log) is not eager
    report = subprocess.run([sys.executable, "-m", "allocscope", "report", "--json", card["capture"]],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert json.loads(report.stdout)["allocator"]["replay"]["exact"]


def test_the_kv_cache_that_takes_all_of_the_headroom_fits_in_a_second_run(tmp_path):
    card, _, _ = fit(tmp_path, "L4-24GB", "--enforce-eager")
    kv = card["kv_cache"]
    assert kv["with_headroom_bytes"] > kv["most_bytes"]
    again, log, said = fit(tmp_path, "L4-24GB", "--enforce-eager", "--kv-cache-memory", str(kv["with_headroom_bytes"]))
    assert again["verdict"] == "fits" and said["generated_tokens"] == [6, 6, 6]
    logged = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))
    assert logged == kv["with_headroom_tokens"] == again["kv_cache"]["tokens"]
    # the card is full to what its last MiB and the allocator's rounding leave
    assert 0 <= again["headroom_bytes"] < card["headroom_bytes"] // 16


def test_too_long_a_context_is_vllms_own_error_and_the_length_it_names_fits(tmp_path):
    big = ["--layers", "32", "--hidden", "512", "--intermediate", "1024", "--heads", "8", "--kv-heads", "8",
           "--vocab", "4096", "--requests", "2", "--max-tokens", "4", "--enforce-eager"]
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", "L4-24GB:8GiB", "-o", "long", "--",
                        sys.executable, SCRIPT, *big, "--max-model-len", "131072"], capture_output=True, text=True,
                       timeout=900, cwd=tmp_path)
    assert p.returncode == 1 and "failed (exit status 1)" in p.stderr
    # the engine's cause, not only its client's RuntimeError at the end
    cause = re.search(r"the first error in it: ValueError: To serve at least one request with the model's max seq "
                      r"len \(131072\).*estimated maximum model length is (\d+)", p.stderr)
    assert cause, p.stderr[-3000:]
    length = int(cause.group(1))
    card, _, said = fit(tmp_path, "L4-24GB:8GiB", *big, "--max-model-len", str(length))
    assert card["verdict"] == "fits" and said["generated_tokens"] == [4, 4]
