"""Will it serve? vLLM, unmodified, dry-run on virtual cards with `allocscope
fit` (examples/vllm_generate.py: `LLM(...)` with dummy weights, CUDA graphs
on); prints JSON. Run with the serving venv's python (make test-serving
makes it: vLLM and the torch it pins):

    .venv-serving/bin/python benchmarks/bench_serving.py [--only llama3-8b] [--gpus L4-24GB,H100-80GB] [--fill-check] [--out FILE]

For each model and card:
- vllm: what vLLM logged in the dry run: its KV cache (tokens, GiB, blocks),
  maximum concurrency at max_model_len (8,192 tokens), its CUDA graph
  memory (measured and its own estimate), peak activation, weights and
  non-torch memory, the --kv-cache-memory it suggests; or its refusal;
- allocscope: the fit card: verdict, peak reserved, headroom, the KV cache
  the capture measured (and so the concurrency), what capturing the graphs
  reserved and their private pools, the profile run's peak activation, the
  --kv-cache-memory that takes all of the headroom;
- textbook: weights + KV cache, the usual sizing: (card x
  gpu_memory_utilization - weights) / (bytes a token's KV takes x 8,192)
  concurrent requests, with no activations, graphs or CUDA context;
- the dry run: wall time of the fit (start-up, compile, capture, a few
  requests, the analysis) and the largest resident memory of its processes;
- with --fill-check: each fit started again with the --kv-cache-memory
  that vLLM says fills the card and with allocscope's (the KV cache plus
  all of the headroom): whether each fits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import emit, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "vllm_generate.py")
CONTEXT = 8192
UTILIZATION = 0.9
# Runs a command, then writes the largest resident memory of its processes (KiB) to argv[1].
_MAX_RSS = ("import resource, subprocess, sys; status = subprocess.run(sys.argv[2:]).returncode; "
            "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
            "sys.exit(status)")

# Shapes of public configs (bf16 dummy weights).
MODELS = {
    # meta-llama/Meta-Llama-3-8B
    "llama3-8b": ["--layers", "32", "--hidden", "4096", "--intermediate", "14336", "--heads", "32",
                  "--kv-heads", "8", "--vocab", "128256"],
    # Qwen/Qwen1.5-MoE-A2.7B: 60 experts a layer, 4 a token, a shared expert
    "qwen1.5-moe-a2.7b": ["--layers", "24", "--hidden", "2048", "--intermediate", "5632", "--heads", "16",
                          "--kv-heads", "16", "--vocab", "151936", "--experts", "60", "--experts-per-token", "4",
                          "--moe-intermediate", "1408"],
}
GPUS = ("L4-24GB", "A100-40GB", "H100-80GB")


def _arg(argv: list[str], name: str) -> int:
    return int(argv[argv.index(name) + 1])


def textbook(argv: list[str], total: int | None, weights: int | None) -> dict:
    """Weights + KV cache: the sizing a spreadsheet does."""
    layers, kv_heads = _arg(argv, "--layers"), _arg(argv, "--kv-heads")
    head_dim = _arg(argv, "--hidden") // _arg(argv, "--heads")
    per_token = 2 * layers * kv_heads * head_dim * 2
    out = {"kv_bytes_per_token": per_token, "kv_bytes_at_context": per_token * CONTEXT}
    if total and weights is not None:
        room = int(total * UTILIZATION) - weights
        out["kv_cache_bytes"] = room
        out["concurrency_at_context"] = round(room / (per_token * CONTEXT), 2)
    return out


def run(model: str, gpu: str, workdir: str, kv_cache_memory: int | None = None) -> dict:
    argv = MODELS[model]
    out = os.path.join(workdir, f"{model}-{gpu}-{kv_cache_memory}")
    cmd = [sys.executable, "-m", "allocscope", "fit", "--gpu", gpu, "--json", "-o", out, "--", sys.executable, SCRIPT,
           *argv, "--max-model-len", str(CONTEXT), "--gpu-memory-utilization", str(UTILIZATION), "--requests", "4",
           "--max-tokens", "8", *(["--kv-cache-memory", str(kv_cache_memory)] if kv_cache_memory else [])]
    rss = out + ".rss"
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _MAX_RSS, rss, *cmd], capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    with open(rss) as f:
        max_rss_kib = int(f.read())
    try:
        card = json.loads(p.stdout)["cards"][0]
    except (ValueError, KeyError, IndexError):
        return {"model": model, "gpu": gpu, "error": p.stderr[-2000:]}
    log_path = os.path.join(out, f"{gpu}.log")
    said_line = []
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8", errors="replace") as f:
            said_line = [line for line in f if line.startswith('{"num_gpu_blocks"')]
    serving = card.get("serving") or {}
    said, measured = serving.get("said") or {}, serving.get("measured") or {}
    kv = card.get("kv_cache") or {}
    blocks = json.loads(said_line[-1]) if said_line else {}
    return {
        "model": model, "gpu": gpu, "verdict": card["verdict"], "exit_status": card["exit_status"],
        "vllm": {k: said.get(k) for k in ("kv_cache_tokens", "kv_cache_bytes", "max_concurrency", "graph_bytes",
                                          "graph_estimate_bytes", "peak_activation_bytes", "consumed_bytes",
                                          "kv_cache_memory_to_fill", "kv_cache_memory_to_fit", "refusal")}
        | {"num_gpu_blocks": blocks.get("num_gpu_blocks"), "block_size": blocks.get("block_size")},
        "allocscope": {
            "peak_reserved_bytes": card.get("peak_reserved_bytes"), "headroom_bytes": card.get("headroom_bytes"),
            "shortfall_bytes": card.get("shortfall_bytes"),
            "kv_cache_bytes": kv.get("bytes"), "kv_cache_tokens": kv.get("tokens"),
            "concurrency_at_context": serving.get("max_concurrency"),
            "kv_cache_with_headroom_bytes": kv.get("with_headroom_bytes"),
            "capture_graphs_reserved_bytes": (measured.get("capture_model") or {}).get("reserved_bytes"),
            "graph_pool_bytes": measured.get("graph_pool_bytes"),
            "profile_peak_activation_bytes": (measured.get("profile_run") or {}).get("peak_activation_bytes"),
            "weights_bytes": measured.get("weights_bytes"),
            "outside_allocator_bytes": measured.get("outside_allocator_bytes"),
        },
        "textbook": textbook(argv, card.get("total_bytes"), measured.get("weights_bytes")),
        "dry_run": {"wall_s": round(wall, 1),
                    "max_rss_mib": round(max_rss_kib / 1024)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--fill-check", action="store_true",
                        help="start each fit again with vLLM's --kv-cache-memory to fill the card, and with allocscope's")
    parser.add_argument("--out")
    args = parser.parse_args()
    import vllm

    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for model in args.only.split(","):
            for gpu in args.gpus.split(","):
                result = run(model, gpu, workdir)
                if args.fill_check and result.get("verdict") == "fits":
                    # Each --kv-cache-memory said to fill the card, started:
                    # vLLM's suggestion and the cache with all of the headroom.
                    result["fill_check"] = {}
                    for who, kv in (("vllm", result["vllm"]["kv_cache_memory_to_fill"]),
                                    ("allocscope", result["allocscope"]["kv_cache_with_headroom_bytes"])):
                        again = run(model, gpu, workdir, kv)
                        result["fill_check"][who] = {
                            "kv_cache_memory": kv, "verdict": again.get("verdict"),
                            "headroom_bytes": (again.get("allocscope") or {}).get("headroom_bytes"),
                            "shortfall_bytes": (again.get("allocscope") or {}).get("shortfall_bytes"),
                            "kv_cache_tokens": (again.get("allocscope") or {}).get("kv_cache_tokens")}
                results.append(result)
                print(json.dumps(results[-1]), file=sys.stderr)
    emit({"benchmark": "serving", **environment(), "vllm": vllm.__version__, "context": CONTEXT,
          "gpu_memory_utilization": UTILIZATION, "results": results}, args.out)


if __name__ == "__main__":
    main()
