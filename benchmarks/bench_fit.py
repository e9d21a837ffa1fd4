"""Will it fit? Real models (examples/real_models.py) dry-run on the virtual
GPU with `allocscope fit`, against the textbook formula and torch's
MemTracker under FakeTensorMode; prints JSON.

    python benchmarks/bench_fit.py [--gpu H100-80GB] [--impl auto|hf|plain] [--only gpt2,bert] [--out FILE]
    python benchmarks/bench_fit.py --physical   # on a GPU machine: the same workloads on the card too

For each workload:
- real_allocator: torch's own max_memory_reserved/allocated in the dry run:
  torch's real caching allocator, on the virtual card (kernels compute
  nothing, so the dry run's wall time is the CPU's);
- allocscope: what `allocscope fit --json` says (its peaks equal the
  allocator's, by construction), the dry run's wall time (start-up, steps,
  analysis), one step's time, the host memory of the whole run;
- textbook: the seeds' estimate (parameters + gradients + optimizer state +
  activations, docs/attribution.md) from the watched run, and its error
  against the allocator's peak reserved;
- memtracker: torch.distributed._tools.mem_tracker.MemTracker over the same
  steps under FakeTensorMode (run on the virtual GPU so that CUDA exists for
  the fake tensors), its peak and its error against the peak reserved;
- physical (--physical, on a GPU): the workload on the card itself, and the
  dry run's error against it.
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

WORKLOADS = {
    "gpt2": ["gpt2"],
    "gpt2-bf16": ["gpt2", "--amp", "bf16"],
    "gpt2-checkpoint": ["gpt2", "--checkpoint"],
    "gpt2-accumulate4": ["gpt2", "--batch-size", "2", "--accumulate", "4"],
    "gpt2-compile": ["gpt2", "--compile"],
    "llama": ["llama"],
    "llama-bf16-checkpoint": ["llama", "--amp", "bf16", "--checkpoint"],
    "bert": ["bert"],
    "resnet50": ["resnet50"],
    "convnext": ["convnext"],
    "unet": ["unet"],
}

# Runs a command and reports the largest resident set of its process tree.
_RUSAGE = ("import json, resource, subprocess, sys\n"
           "r = subprocess.run(sys.argv[1:])\n"
           "print('BENCH_RUSAGE ' + json.dumps({'exit': r.returncode,"
           " 'max_rss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}), file=sys.stderr)\n")


def _measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[dict, str, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _RUSAGE, *cmd], capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    usage = next(json.loads(line.split(" ", 1)[1]) for line in proc.stderr.splitlines()
                 if line.startswith("BENCH_RUSAGE "))
    return usage, proc.stdout, proc.stderr, seconds


def _last_error(err: str, usage: dict) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip() and not x.startswith("BENCH_RUSAGE ")]
    return (lines[-1] if lines else f"exit {usage['exit']}")[:300]


def _model_line(text: str) -> dict | None:
    return next((json.loads(line) for line in text.splitlines() if line.startswith('{"model"')), None)


def _pct(estimate: int | None, real: int | None) -> float | None:
    return None if not estimate or not real else round(100.0 * (estimate - real) / real, 1)


def dry_run(args: list[str], gpu: str, workdir: str) -> dict:
    cmd = [sys.executable, "-m", "allocscope", "fit", "--gpu", gpu, "--json", "-f", "-o", workdir, "--",
           sys.executable, SCRIPT, *args, "--json"]
    usage, out, err, seconds = _measured(cmd)
    model = _model_line(err) or _model_line(out)
    try:
        card = json.loads(out)["cards"][0]
    except (ValueError, KeyError, IndexError):
        return {"error": f"fit exited {usage['exit']}: {_last_error(err, usage)}"}
    est = card.get("estimate") or {}
    return {
        "error": None if card["verdict"] in ("fits", "out of memory") else _last_error(err, usage),
        "model": model,
        "real_allocator": None if model is None else {"peak_reserved": model.get("max_memory_reserved"),
                                                      "peak_allocated": model.get("max_memory_allocated")},
        "allocscope": {"verdict": card["verdict"], "peak_reserved": card.get("peak_reserved_bytes"),
                       "peak_allocated": card.get("peak_allocated_bytes"),
                       "dry_run_seconds": round(seconds, 2),
                       "step_seconds": None if model is None else round(model["seconds"] / model["steps"], 3),
                       "max_rss_mib": round(usage["max_rss_kib"] / 1024, 1)},
        "textbook": {"bytes": est.get("textbook_bytes")},
    }


def memtracker(args: list[str], gpu: str) -> dict:
    from allocscope import vgpu

    usage, out, err, seconds = _measured([sys.executable, os.path.abspath(__file__), "--memtracker-child", *args],
                                         env=vgpu.environment(gpu))
    line = next((json.loads(x) for x in out.splitlines() if x.startswith('{"memtracker"')), None)
    if line is None:
        return {"error": _last_error(err, usage), "seconds": round(seconds, 2)}
    return {"bytes": line["memtracker"], "seconds": round(seconds, 2),
            "max_rss_mib": round(usage["max_rss_kib"] / 1024, 1)}


def physical(args: list[str]) -> dict:
    usage, out, err, seconds = _measured([sys.executable, SCRIPT, *args, "--json"],
                                         env={k: v for k, v in os.environ.items() if not k.startswith("ALLOCSCOPE_")})
    model = _model_line(out)
    if model is None:
        return {"error": _last_error(err, usage)}
    return {"peak_reserved": model.get("max_memory_reserved"), "peak_allocated": model.get("max_memory_allocated"),
            "step_seconds": round(model["seconds"] / model["steps"], 3)}


def memtracker_child(argv: list[str]) -> None:
    """Runs real_models.py's loop under FakeTensorMode and MemTracker; prints its peak."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import model_zoo
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--amp")
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--impl", default="auto")
    a = p.parse_args(argv)
    if a.compile:
        print("MemTracker does not see inside a torch.compile'd graph: not run", file=sys.stderr)
        sys.exit(3)
    if a.accumulate > 1:  # it raises NotImplementedError at the second forward of a step
        print("MemTracker does not track several forward calls of a module per step (gradient accumulation): "
              "not run", file=sys.stderr)
        sys.exit(3)
    device = torch.device("cuda")
    with FakeTensorMode():
        with device:
            model, make_batch, loss_fn = model_zoo.build(a.model, a.impl, checkpointing=a.checkpoint)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            model_zoo.train_steps(model, opt, make_batch, loss_fn, device=device, steps=2, accumulate=a.accumulate,
                                  batch=a.batch_size or model_zoo.default_batch(a.model), amp=a.amp,
                                  after_step=lambda step: mt.reset_mod_stats() if step == 0 else None)
        peak = mt.get_tracker_snapshot("peak")
    print(json.dumps({"memtracker": int(sum(v["Total"] for k, v in peak.items() if str(k).startswith("cuda")))}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--memtracker-child":
        return memtracker_child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--impl", choices=("auto", "hf", "plain"), default="auto")
    parser.add_argument("--only", help="comma-separated workload names: " + ", ".join(WORKLOADS))
    parser.add_argument("--physical", action="store_true", help="also run each workload on this machine's GPU")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload {unknown[0]!r}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            wargs = WORKLOADS[name] + ["--impl", args.impl]
            r = dry_run(wargs, args.gpu, os.path.join(tmp, name))
            r["memtracker"] = memtracker(wargs, args.gpu)
            real = (r.get("real_allocator") or {}).get("peak_reserved")
            r.get("textbook", {})["error_pct"] = _pct(r.get("textbook", {}).get("bytes"), real)
            r["memtracker"]["error_pct"] = _pct(r["memtracker"].get("bytes"), real)
            if args.physical:
                r["physical"] = physical(wargs)
                r["physical"]["allocscope_error_pct"] = _pct(real, r["physical"].get("peak_reserved"))
            results[name] = r
            print(f"{name}: done", file=sys.stderr)
    emit({"benchmark": "fit", **environment(), "gpu": args.gpu, "impl": args.impl,
          "command": "python benchmarks/bench_fit.py " + " ".join(sys.argv[1:]), "workloads": results}, args.out)


if __name__ == "__main__":
    main()
