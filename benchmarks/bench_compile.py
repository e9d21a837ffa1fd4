"""Compiled models on the virtual GPU: peak memory with torch.compile's
default backend (inductor: real Triton kernels, compiled on the CPU and
launched as no-ops), with aot_eager (what allocscope used in its place
before) and eager; and how long compiling takes here. Prints JSON.

    python benchmarks/bench_compile.py [--gpu H100-80GB] [--models gpt2,llama] [--impl auto|hf|plain] [--out FILE]

Each run is examples/real_models.py in a fresh process under
`allocscope run --gpu GPU --no-record` (2 steps, AdamW, bf16 autocast unless
--no-amp), with a cold Inductor cache of its own (TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR in a temporary folder), so that compile time is a first
compile's. Rows: torch's max_memory_reserved / max_memory_allocated and the
run's wall time (`seconds`: the training steps, compile included;
`wall_s`: the whole process).
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
SCRIPT = os.path.join(ROOT, "examples", "real_models.py")
BACKENDS = ("inductor", "aot_eager", "eager")


def run(gpu: str, model: str, backend: str, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        compile_args = [] if backend == "eager" else ["--compile", "--compile-backend", backend]
        cmd = [sys.executable, "-m", "allocscope", "run", "--gpu", gpu, "--no-record", "--", sys.executable, SCRIPT,
               model, "--json", *compile_args, *args]
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"model": model, "backend": backend, "failed": proc.stderr.strip().splitlines()[-1:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"model": model, "impl": out["impl"], "backend": backend, "max_memory_reserved": out["max_memory_reserved"],
            "max_memory_allocated": out["max_memory_allocated"], "seconds": round(out["seconds"], 2),
            "wall_s": round(wall, 2), "batch": out["batch"], "parameters": out["parameters"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--impl", choices=("auto", "hf", "plain"), default="auto",
                        help="examples/real_models.py --impl (auto: transformers' models where installed)")
    parser.add_argument("--no-amp", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    extra = ["--impl", args.impl] + ([] if args.no_amp else ["--amp", "bf16"])
    rows = []
    for model in args.models.split(","):
        for backend in BACKENDS:
            rows.append(run(args.gpu, model, backend, extra))
            print(json.dumps(rows[-1]), file=sys.stderr)
    for model in {r["model"] for r in rows}:
        by = {r["backend"]: r for r in rows if r["model"] == model and "failed" not in r}
        if "inductor" in by:
            for other in ("aot_eager", "eager"):
                if other in by:
                    by["inductor"][f"reserved_vs_{other}"] = round(
                        by["inductor"]["max_memory_reserved"] / by[other]["max_memory_reserved"] - 1, 4)
    emit({"benchmark": "compile", "environment": environment() | {"virtual_gpu": args.gpu}, "amp": not args.no_amp,
          "runs": rows}, args.out)


if __name__ == "__main__":
    main()
