"""Convolution nets on the virtual GPU with cuDNN (the stand-in, its
workspaces from the tables recorded on cards) and without it (torch's native
kernels); on the card where one is lent (--physical). Prints JSON.

    python benchmarks/bench_cudnn.py [--gpu H100-80GB] [--models resnet50,convnext,unet] [--physical] [--out FILE]

Each run is examples/real_models.py --impl plain (2 AdamW steps, fp32 and
bf16 autocast, default batch sizes) in a fresh process, under `allocscope run
--gpu GPU --no-record` (virtual) or as is (--physical, on the card). Rows:
torch's max_memory_reserved / max_memory_allocated, the steps' seconds, and
the ops one step runs (a profiler count: im2col's many small ops are what
made per-op costs on the virtual GPU larger than on a card).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import emit, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "real_models.py")
OPS = r"""
import os, sys, torch
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import model_zoo
if sys.argv[3] == "off":
    torch.backends.cudnn.enabled = False
with torch.device("cuda"):
    model, make_batch, loss_fn = model_zoo.build(sys.argv[2], "plain")
inputs = make_batch(model_zoo.default_batch(sys.argv[2]), torch.device("cuda"))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    loss_fn(model, inputs).backward()
print(len(prof.events()))
"""


def run(model: str, amp: str | None, cudnn: bool, gpu: str | None) -> dict:
    prefix = [sys.executable, "-m", "allocscope", "run", "--gpu", gpu, "--no-record", "--"] if gpu else []
    args = [sys.executable, SCRIPT, model, "--impl", "plain", "--json", *(["--amp", amp] if amp else []),
            *([] if cudnn else ["--no-cudnn"])]
    t0 = time.perf_counter()
    out = subprocess.run(prefix + args, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    ops = subprocess.run(prefix + [sys.executable, "-c", OPS, ROOT, model, "on" if cudnn else "off"],
                         capture_output=True, text=True, timeout=900)
    return {"peak_reserved": r["max_memory_reserved"], "peak_allocated": r["max_memory_allocated"],
            "batch": r["batch"], "seconds": round(r["seconds"], 3), "wall_s": round(wall, 2),
            "ops_per_step": int(ops.stdout.strip().splitlines()[-1]) if ops.returncode == 0 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="H100-80GB", help="the virtual GPU (default H100-80GB)")
    parser.add_argument("--models", default="resnet50,convnext,unet")
    parser.add_argument("--physical", action="store_true", help="on this machine's card, not a virtual one")
    parser.add_argument("--out")
    a = parser.parse_args()
    gpu = None if a.physical else a.gpu
    rows = {}
    for model in a.models.split(","):
        for amp in (None, "bf16"):
            name = model + (f"-{amp}" if amp else "")
            rows[name] = {"cudnn": run(model, amp, True, gpu), "no_cudnn": run(model, amp, False, gpu)}
            print(name, json.dumps(rows[name]), file=sys.stderr)
    from allocscope.vgpu import cudnn

    report = {"benchmark": "cudnn", **environment(), "device": "physical" if a.physical else f"virtual {a.gpu}",
              "cudnn_tables": {"path": cudnn.table_path(), "rows": cudnn.table_rows()}, "workloads": rows}
    emit(report, a.out)


if __name__ == "__main__":
    main()
