"""What computing values costs a dry run (docs/vgpu.md, "Values"), and what MoE routing changes; prints JSON.

    python benchmarks/bench_values.py [--only NAME,...] [--out FILE]

Each case runs `allocscope run --gpu H100-80GB --no-record --compute MODE [--routing R]` in a fresh process and
measures its wall time and the largest resident set (peak RSS) of its processes, with the command's own JSON
(torch's peaks; for the MoE step, tokens per expert). `none` is the virtual GPU without computed values (as
before issue 45), `values` the default, `all` the exact mode.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from _common import emit, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "examples", "real_models.py")
MOE = os.path.join(ROOT, "examples", "moe_train.py")
LLAMA7B = os.path.join(ROOT, "benchmarks", "llama7b_step.py")

# name -> (command after python, [(compute, routing), ...])
CASES: dict[str, tuple[list[str], list[tuple[str, str | None]]]] = {
    "gpt2": ([MODELS, "gpt2", "--json"], [("none", None), ("values", None)]),
    "llama-1.1b": ([MODELS, "llama", "--json"], [("none", None), ("values", None)]),
    "bert": ([MODELS, "bert", "--json"], [("none", None), ("values", None)]),
    "resnet50": ([MODELS, "resnet50", "--json"], [("none", None), ("values", None)]),
    "llama-7b": ([LLAMA7B], [("none", None), ("values", None)]),
    "gpt2-exact": ([MODELS, "gpt2", "--json", "--steps", "1", "--batch-size", "2"],
                   [("values", None), ("all", None)]),
    "mixtral-2-layers": ([MOE], [("none", None), ("values", "balanced"), ("values", "balanced:2"),
                                 ("values", "worst")]),
    "mixtral-2-layers-narrow": ([MOE, "--hidden", "1024", "--intermediate", "3584", "--batch-size", "2",
                                 "--seq-len", "256"],
                                [("values", "balanced"), ("values", "worst"), ("all", None)]),
}


def measure(command: list[str], compute: str, routing: str | None) -> dict:
    run = [sys.executable, "-m", "allocscope", "run", "--gpu", "H100-80GB", "--no-record", "--compute", compute]
    if routing:
        run += ["--routing", routing]
    # a fresh process per case: RUSAGE_CHILDREN's peak is its descendants' largest
    probe = ("import json, resource, subprocess, sys, time; t = time.time(); "
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(json.dumps({'status': p.returncode, 'wall_s': round(time.time() - t, 2), "
             "'max_rss_mib': round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1), "
             "'stdout': p.stdout[-4000:], 'stderr': p.stderr[-1500:]}))")
    out = json.loads(subprocess.run([sys.executable, "-c", probe, *run, "--", sys.executable, *command],
                                    capture_output=True, text=True).stdout)
    lines = [ln for ln in out.pop("stdout").strip().splitlines() if ln.startswith("{")]
    result = {"compute": compute, "routing": routing, **out}
    if lines:
        result["command_output"] = json.loads(lines[-1])
    if out["status"] == 0:
        result.pop("stderr")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated cases: " + ", ".join(CASES))
    parser.add_argument("--out")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    report = {"benchmark": "values", **environment(), "cases": {}}
    for name in names:
        command, modes = CASES[name]
        report["cases"][name] = [measure(command, compute, routing) for compute, routing in modes]
        print(f"bench_values: {name} done", file=sys.stderr)
    emit(report, args.out)


if __name__ == "__main__":
    main()
