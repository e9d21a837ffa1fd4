"""What each recording mode adds to a training step, in instructions
(valgrind's callgrind); prints JSON.

    python benchmarks/bench_step_instructions.py --gpu H100-80GB [--steps 3] [--modes off,...] [--out FILE]

bench_step.py's GPT and ResNet steps on the virtual GPU, where kernels cost
nothing, so what a step costs is the CPU's work: each mode's steps run
under callgrind in a process of their own, counted from the first measured
step to the last (every thread: the program's, the autograd engine's, the
recorder's writer), after two unmeasured ones. Modes: bench_step.py's, and
parts of watching without ops (PARTS: watching with no saved-tensor hooks,
with the root module's hooks alone), whose difference to
allocscope-watch-noops is what that part costs. Instructions are not
seconds (a cache miss costs more than an add), but they are the same on
every run of the same build: on a shared machine whose wall and CPU times
move by tens of percent from run to run (bench_step.py), a 1% change shows.
Needs valgrind and its headers (valgrind/callgrind.h), and gcc.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

_TOGGLE_C = r"""
#include <valgrind/callgrind.h>
void allocscope_bench_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT; }
void allocscope_bench_stop(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def _toggle_library(folder: str) -> str:
    src, lib = os.path.join(folder, "toggle.c"), os.path.join(folder, "libtoggle.so")
    with open(src, "w") as f:
        f.write(_TOGGLE_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
    return lib


def _watch_without_saved_hooks(rec, model, opt):
    import torch.autograd.graph

    class Refused:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            raise RuntimeError("(as where saved-tensor hooks are disabled)")

    torch.autograd.graph.saved_tensors_hooks = Refused  # the watcher then goes without (watcher.py)
    rec.watch(model, opt)


def _watch_root_hooks_only(rec, model, opt):
    w = rec.watch(model, opt)
    # (Watch registers a pre-hook and a hook per module, in model.modules() order, the root's first)
    for h in w._handles[2:2 * len(list(model.modules()))]:
        h.remove()


# Parts of watching without ops (record(ops=False)), each in its own run:
# watch-noops over these is what the part costs.
PARTS = {
    "watch-noops-without-saved-hooks": _watch_without_saved_hooks,
    "watch-noops-root-hooks-only": _watch_root_hooks_only,
}


def child(mode: str, workload: str, steps: int, lib: str) -> None:
    """Runs in callgrind: two unmeasured steps, then `steps` measured ones."""
    import ctypes

    import torch

    import bench_step

    toggle = ctypes.CDLL(lib)
    armed = {"on": False, "calls": 0}

    def clock() -> float:
        # run_steps reads its clock before the first step and after the last
        if armed["on"]:
            (toggle.allocscope_bench_start if armed["calls"] % 2 == 0 else toggle.allocscope_bench_stop)()
            armed["calls"] += 1
        return 0.0

    bench_step.run_steps.__defaults__ = (clock,)
    torch.manual_seed(0)
    model, make_input, loss_fn, _ = bench_step.workloads("cuda", False)[workload]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with tempfile.TemporaryDirectory() as tmp:
        bench_step.timed("off", model, opt, make_input, loss_fn, 2, "cuda", os.path.join(tmp, "w.alsc"))
        if mode in PARTS:
            import allocscope

            with allocscope.record(os.path.join(tmp, "m.alsc"), device="cuda", ops=False) as rec:
                PARTS[mode](rec, model, opt)
                bench_step.run_steps(model, opt, make_input, loss_fn, 2, "cuda")
                armed["on"] = True
                bench_step.run_steps(model, opt, make_input, loss_fn, steps, "cuda")
        else:
            armed["on"] = True
            bench_step.timed(mode, model, opt, make_input, loss_fn, steps, "cuda", os.path.join(tmp, "m.alsc"))
    assert armed["calls"] == 2, armed


def instructions(out_file: str) -> int:
    with open(out_file) as f:
        text = f.read()
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if m is None:
        raise RuntimeError(f"no totals in {out_file}")
    return int(m.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--memory", default="4GiB", help="the virtual GPU's memory")
    parser.add_argument("--modes", default="off,allocscope-noops,allocscope-python,allocscope-watch,"
                                           "allocscope-watch-noops,torch-history")
    parser.add_argument("--workloads", default="gpt,resnet")
    parser.add_argument("--jobs", type=int, default=2, help="processes at a time")
    parser.add_argument("--out")
    parser.add_argument("--keep", help="a folder to keep callgrind's output files in (callgrind_annotate reads them)")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "WORKLOAD", "LIB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steps, args.child[2])
        return

    from allocscope import vgpu
    from _common import emit, environment

    modes, names = args.modes.split(","), args.workloads.split(",")
    # (valgrind refuses the address space a whole card reserves: a smaller one, the same allocator)
    env = {**vgpu.environment(args.gpu, memory=args.memory), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        lib = _toggle_library(tmp)
        jobs = [(w, m) for w in names for m in modes]
        running: list[tuple[tuple[str, str], subprocess.Popen, str]] = []
        counts: dict[tuple[str, str], int] = {}

        def reap(entry):
            key, proc, out = entry
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{key}: callgrind run failed:\n{err[-3000:]}")
            counts[key] = instructions(out)
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copy(out, args.keep)

        for w, m in jobs:
            if len(running) >= args.jobs:
                reap(running.pop(0))
            out = os.path.join(tmp, f"cg.{w}.{m}")
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                   f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__),
                   "--steps", str(args.steps), "--child", m, w, lib]
            running.append(((w, m), subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.PIPE, text=True), out))
        for entry in running:
            reap(entry)

    results = {}
    for w in names:
        per_step = {m: counts[(w, m)] / args.steps for m in modes}
        off = per_step.get("off")
        over = {m: round(v - off) for m, v in per_step.items() if off is not None and m != "off"}

        def ratio(a: str, b: str) -> float | None:
            return round(over[a] / over[b], 2) if a in over and b in over and over[b] > 0 else None

        results[w] = {
            "instructions_per_step": {m: round(v) for m, v in per_step.items()},
            "instructions_over_off": over,
            "overhead_pct": {m: round(100 * v / off, 2) for m, v in over.items()} if off else {},
            "watch_over_recording": ratio("allocscope-watch", "allocscope-python"),
            "watch_noops_over_recording_noops": ratio("allocscope-watch-noops", "allocscope-noops"),
            "watch_noops_over_torch": ratio("allocscope-watch-noops", "torch-history"),
            "watch_over_torch": ratio("allocscope-watch", "torch-history"),
            "recording_noops_over_torch": ratio("allocscope-noops", "torch-history"),
            "saved_hooks": (round(over["allocscope-watch-noops"] - over["watch-noops-without-saved-hooks"])
                            if "watch-noops-without-saved-hooks" in over and "allocscope-watch-noops" in over
                            else None),
            "module_hooks": (round(over["allocscope-watch-noops"] - over["watch-noops-root-hooks-only"])
                             if "watch-noops-root-hooks-only" in over and "allocscope-watch-noops" in over
                             else None),
        }
    emit({"benchmark": "step_instructions", **environment(), "virtual_gpu": args.gpu, "steps": args.steps,
          "command": "python benchmarks/bench_step_instructions.py " + " ".join(sys.argv[1:]),
          "results": results}, args.out)


if __name__ == "__main__":
    main()
