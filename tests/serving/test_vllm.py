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

import allocscope
from allocscope.capture.format import EventKind

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
    # vLLM's own figures beside the capture's, which agree where vLLM measured (to its 0.01 GiB)
    said, measured = card["serving"]["said"], card["serving"]["measured"]
    assert said["kv_cache_tokens"] == logged and said["max_model_len"] == 1024
    assert card["serving"]["max_concurrency"] == said["max_concurrency"]
    gib = 1 << 30
    profile = measured["profile_run"]["peak_activation_bytes"]
    # (vLLM's peak activation holds its graph estimate where it captures graphs)
    assert abs(profile + said.get("graph_estimate_bytes", 0) - said["peak_activation_bytes"]) <= 0.01 * gib
    if eager:
        assert measured["capture_model"] is None and measured["graph_pool_bytes"] == 0
    else:
        # vLLM's "actual" graph memory: what capturing them took of the device's free memory, as it rounds
        assert round(measured["capture_model"]["reserved_bytes"] / gib, 2) == round(said["graph_bytes"] / gib, 2)
        assert 0 < measured["graph_pool_bytes"] <= measured["capture_model"]["reserved_bytes"]


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


BIG = ["--layers", "32", "--hidden", "512", "--intermediate", "1024", "--heads", "8", "--kv-heads", "8",
       "--vocab", "4096", "--requests", "2", "--max-tokens", "4", "--enforce-eager"]


def test_too_long_a_context_is_vllms_own_error_and_the_length_it_names_fits(tmp_path):
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", "L4-24GB:8GiB", "-o", "long", "--json",
                        "--", sys.executable, SCRIPT, *BIG, "--max-model-len", "131072"], capture_output=True,
                       text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 1
    log = (tmp_path / "long" / "L4-24GB-8GiB.log").read_text()
    cause = re.search(r"ValueError: To serve at least one request with the model's max seq len \(131072\).*"
                      r"estimated maximum model length is (\d+)", log)
    assert cause, log[-3000:]
    length = int(cause.group(1))
    # vLLM's refusal is the card running out of memory, by what the tokens past its length take
    card = json.loads(p.stdout)["cards"][0]
    assert card["verdict"] == "out of memory" and card["ooms"] == 0
    refusal = card["serving"]["said"]["refusal"]
    assert refusal["max_model_len"] == 131072 and refusal["estimated_max_model_len"] == length
    assert card["shortfall_bytes"] == refusal["shortfall_bytes"] > 0
    card, _, said = fit(tmp_path, "L4-24GB:8GiB", *BIG, "--max-model-len", str(length))
    assert card["verdict"] == "fits" and said["generated_tokens"] == [4, 4]


def test_the_longest_max_model_len_that_fits_is_searched_and_is_vllms_own_limit(tmp_path):
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", "L4-24GB:8GiB", "-o", "search", "--json",
                        "--search", "LEN=1024..131072", "--", sys.executable, SCRIPT, *BIG, "--max-model-len",
                        "{LEN}"], capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    card = json.loads(p.stdout)["cards"][0]
    largest = card["largest"]
    # the length vLLM reckons fits, from the refusal of the next
    nxt = card["at_next"]["serving"]["said"]["refusal"]
    assert nxt["max_model_len"] == largest + 1 and nxt["estimated_max_model_len"] == largest
    assert card["at_largest"]["serving"]["said"]["kv_cache_tokens"] >= largest


def test_the_most_sequences_that_fit_is_searched_and_one_more_is_vllms_own_refusal(tmp_path):
    # max_num_seqs sizes the sampler's profile run (logits of a 128k vocabulary
    # a sequence), which takes from the KV cache: one more sequence than the
    # answer leaves less than one request of max_model_len, and vLLM refuses
    big_vocab = [*BIG[:BIG.index("--vocab")], "--vocab", "128256", *BIG[BIG.index("--vocab") + 2:]]
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", "L4-24GB:8GiB", "-o", "search", "--json",
                        "--search", "SEQS=1..8192", "--", sys.executable, SCRIPT, *big_vocab, "--max-model-len",
                        "90000", "--max-num-seqs", "{SEQS}"], capture_output=True, text=True, timeout=1800,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    card = json.loads(p.stdout)["cards"][0]
    largest = card["largest"]
    assert 1 < largest < 8192 and card["confirmed"]
    assert card["at_largest"]["verdict"] == "fits"
    assert card["at_largest"]["serving"]["said"]["kv_cache_tokens"] >= 90000
    refusal = card["at_next"]["serving"]["said"]["refusal"]
    assert card["at_next"]["verdict"] == "out of memory" and refusal["max_model_len"] == 90000
    assert largest + 1 in card["tried"] and refusal["estimated_max_model_len"] < 90000


def test_vllm_serve_starts_serves_and_stops_and_its_engine_is_the_card(tmp_path):
    out = tmp_path / "serve"
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", "L4-24GB", "--json", "-o", str(out), "--",
                        sys.executable, f"{ROOT}/examples/vllm_serve.py", *MODEL, "--enforce-eager"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    log = (out / "L4-24GB.log").read_text()
    assert p.returncode == 0, log[-4000:]
    said = json.loads([line for line in log.splitlines() if line.startswith("{\"generated_tokens\"")][-1])
    assert said == {"generated_tokens": [6, 6, 6], "server_exit_status": 0}
    card = json.loads(p.stdout)["cards"][0]
    logged = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))
    assert card["verdict"] == "fits" and card["kv_cache"]["tokens"] == logged
    # The API server kills its engine core at shutdown (SIGTERM, then at
    # once SIGKILL): the engine's capture is read as far as it was written,
    # and the device's last reading stands in for the end's.
    info = subprocess.run([sys.executable, "-m", "allocscope", "info", card["capture"]], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert info.returncode == 0 and "vllm serve" in info.stdout
    assert card["outside_allocator_bytes"] == 512 << 20 and card["headroom_bytes"] > 0


@pytest.mark.parametrize("gpus, tp", [("2xL4-24GB", 2), ("4xH100-80GB", 4)])
def test_tensor_parallel_ranks_each_hold_their_shard_of_the_kv_cache_as_vllm_logs(tmp_path, gpus, tp):
    # (with vLLM's custom all-reduce, whose buffers the workers share through CUDA IPC)
    card, log, said = fit(tmp_path, gpus, "--enforce-eager", "--tensor-parallel-size", str(tp), "--kv-heads", "4")
    assert card["verdict"] == "fits" and said["generated_tokens"] == [6, 6, 6]
    logged = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))
    # one worker's capture: its shard of the key/value heads, and so the tokens vLLM logs
    assert card["kv_cache"]["shape"]["kv_heads"] == 4 // tp
    assert card["kv_cache"]["tokens"] == logged == said["num_gpu_blocks"] * said["block_size"]
    # each worker process recorded on its own card (beside them, processes that allocated nothing)
    workers = [p for p in tmp_path.glob("fit*/*.alsc")
               if (allocscope.load(p, salvage=True).events.kind == EventKind.ALLOC).any()]
    assert len(workers) == tp
