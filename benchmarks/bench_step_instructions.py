"""What each recording mode adds to a training step, in instructions
(valgrind's callgrind); prints JSON.

    python benchmarks/bench_step_instructions.py --gpu H100-80GB [--steps 3] [--modes off,...] [--out FILE]

bench_step.py's GPT and ResNet steps on the virtual GPU, where kernels cost
nothing, so what a step costs is the CPU's work: each mode's steps run
under callgrind in a process of their own, counted from the first measured
step to the last (every thread: the program's, the autograd engine's, the
recorder's writer), after two unmeasured ones in the same mode. Modes:
bench_step.py's (off, allocscope-noops, allocscope-python, allocscope-watch,
allocscope-watch-noops, torch-history, torch-history-cpp), allocscope-autowatch
(rec.auto_watch(): what `allocscope run` does by default), and parts of watching without ops
(watching with no saved-tensor hooks, with the root module's scopes alone: its hooks),
whose difference to allocscope-watch-noops is what that part costs, and watching
with the saved-tensor hook called through Python (watch-noops-python-saved-hooks:
as before allocscope's engine answered for it, csrc/recorder/saved_engine.h). Instructions are not
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
    from allocscope.recording.global_hooks import GlobalHooks

    rec.watch(model, opt)
    root = GlobalHooks.modules.get(model)  # (every module's scopes but the root's go)
    GlobalHooks.modules.filter_values(lambda entries: entries if entries is root else [])


def _watch_python_saved_hooks(rec, model, opt):
    from allocscope.recording.watcher import Watch

    Watch.saved_hooks_in_cpp = False  # (the child process runs one mode)
    rec.watch(model, opt)


# Each mode: (record()'s ops, or None for no allocscope recording; what it
# does once recording). The last two are parts of watching without ops:
# allocscope-watch-noops over them is what that part costs.
MODES = {
    "off": (None, None),
    "torch-history": (None, None),
    "torch-history-cpp": (None, None),
    "allocscope-noops": (False, None),
    "allocscope-python": (True, None),
    "allocscope-watch": (None, lambda rec, model, opt: rec.watch(model, opt)),
    "allocscope-watch-noops": (False, lambda rec, model, opt: rec.watch(model, opt)),
    "allocscope-autowatch": (None, lambda rec, model, opt: rec.auto_watch()),  # (`allocscope run`'s default)
    "watch-noops-without-saved-hooks": (False, _watch_without_saved_hooks),
    "watch-noops-root-hooks-only": (False, _watch_root_hooks_only),
    "watch-noops-python-saved-hooks": (False, _watch_python_saved_hooks),
}


def child(mode: str, workload: str, steps: int, lib: str) -> None:
    """Runs in callgrind: the mode starts, two unmeasured steps (what starts
    once: the writer thread, the tables, the watch's first forward), then
    `steps` measured ones."""
    import contextlib
    import ctypes

    import torch

    import allocscope
    import bench_step

    toggle = ctypes.CDLL(lib)
    torch.manual_seed(0)
    model, make_input, loss_fn, _ = bench_step.workloads("cuda", False)[workload]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    bench_step.run_steps(model, opt, make_input, loss_fn, 2, "cuda")
    ops, setup = MODES[mode]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if mode in ("torch-history", "torch-history-cpp"):
            torch.cuda.memory._record_memory_history(stacks="python" if mode == "torch-history" else "all")
            stack.callback(torch.cuda.memory._record_memory_history, enabled=None)
        elif mode != "off":
            rec = stack.enter_context(allocscope.record(os.path.join(tmp, "m.alsc"), device="cuda", ops=ops))
            if setup is not None:
                setup(rec, model, opt)
        bench_step.run_steps(model, opt, make_input, loss_fn, 2, "cuda")
        torch.cuda.synchronize()
        toggle.allocscope_bench_start()
        bench_step.run_steps(model, opt, make_input, loss_fn, steps, "cuda")
        torch.cuda.synchronize()
        toggle.allocscope_bench_stop()


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
            # What unwinding each allocation's native stack costs (torch::unwind, PCs only: torch
            # symbolizes at snapshot time): the alternative to naming ops from a per-op callback.
            "cpp_unwind": (round(over["torch-history-cpp"] - over["torch-history"])
                           if "torch-history-cpp" in over and "torch-history" in over else None),
            "saved_hooks": (round(over["allocscope-watch-noops"] - over["watch-noops-without-saved-hooks"])
                            if "watch-noops-without-saved-hooks" in over and "allocscope-watch-noops" in over
                            else None),
            # (every module's scopes but the root's: wrapped forwards since 2026-11-26)
            "module_hooks": (round(over["allocscope-watch-noops"] - over["watch-noops-root-hooks-only"])
                             if "watch-noops-root-hooks-only" in over and "allocscope-watch-noops" in over
                             else None),
        }
    emit({"benchmark": "step_instructions", **environment(), "virtual_gpu": args.gpu, "steps": args.steps,
          "command": "python benchmarks/bench_step_instructions.py " + " ".join(sys.argv[1:]),
          "results": results}, args.out)


if __name__ == "__main__":
    main()
