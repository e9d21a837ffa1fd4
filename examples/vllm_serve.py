"""`vllm serve`, started as vLLM's docs start it, then a few requests to its
OpenAI-compatible API and a Ctrl-C, on a Llama-style model made from its
config with dummy weights (examples/vllm_generate.py's; nothing
downloaded; token ids in, no tokenizer).

    python examples/vllm_serve.py --max-model-len 2048 --requests 4
    allocscope fit --gpu L4-24GB -- python examples/vllm_serve.py

Prints, as its last line, one JSON object: the tokens each request got.
(The memory is the server's engine core's, a process of its own: its own
capture.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from vllm_generate import model_arguments, model_folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(server: subprocess.Popen, url: str, timeout: float) -> None:
    """Until GET /health answers; exits with the server's status if it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(server.returncode)
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    server.send_signal(signal.SIGINT)
    sys.exit("vllm serve did not come up in time")


def complete(url: str, model: str, prompt: list[int], max_tokens: int) -> int:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)["usage"]["completion_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser)
    parser.add_argument("--startup-timeout", type=float, default=1200)
    args = parser.parse_args()

    folder = model_folder(args)
    port = free_port()
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    command = [vllm, "serve", folder, "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
               "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
               "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--port", str(port),
               "--host", "127.0.0.1", "--tensor-parallel-size", str(args.tensor_parallel_size),
               *(["--enforce-eager"] if args.enforce_eager else []),
               *(["--kv-cache-memory", str(args.kv_cache_memory)] if args.kv_cache_memory else [])]
    server = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(server, url, args.startup_timeout)
        tokens = [complete(url, folder, [(7 * i + j) % (args.vocab - 3) + 3 for j in range(args.prompt_len)],
                           args.max_tokens) for i in range(args.requests)]
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)  # as Ctrl-C stops it
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    print(json.dumps({"generated_tokens": tokens, "server_exit_status": server.returncode}))


if __name__ == "__main__":
    main()
