"""What naming each allocation's op costs, per op: torch's RecordFunction
dispatch alone (an empty global callback, compiled here with
torch.utils.cpp_extension), allocscope's op callback with and without the
forward stacks it keeps for backward allocations, against recording without
ops and torch's own recorder, and what unwinding the native stack at each
allocation (the other way to name its op) costs; prints JSON (issue 29,
item 1).

The loop: a small forward (elementwise ops, views, a matmul) and its
backward on small tensors, so that per-op costs are not hidden behind
kernels. Modes interleaved over rounds; the fastest round of each mode is
taken (on a shared machine interference only adds time). Per op: the
difference from `off` over the ops RecordFunction sees in one iteration
(counted by the same compiled callback).

    python benchmarks/bench_op_cost.py --gpu H100-80GB    # on the virtual GPU (kernels cost nothing)
    python benchmarks/bench_op_cost.py --device cpu
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

import allocscope
from _common import emit, environment, on_virtual_gpu

_SOURCE = r"""
#include <ATen/record_function.h>
#include <atomic>
namespace {
at::CallbackHandle handle = 0;
std::atomic<long> starts{0};
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) { return nullptr; }
std::unique_ptr<at::ObserverContext> on_count(const at::RecordFunction&) { starts++; return nullptr; }
void on_end(const at::RecordFunction&, at::ObserverContext*) {}
void cb_add(bool count) {
  handle = at::addGlobalCallback(at::RecordFunctionCallback(count ? &on_count : &on_start, &on_end)
      .needsInputs(false).needsOutputs(false).needsIds(false)
      .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}
void cb_remove() { at::removeCallback(handle); handle = 0; }
long cb_counted() { long n = starts; starts = 0; return n; }
}
"""


def compiled():
    from torch.utils.cpp_extension import load_inline

    return load_inline("allocscope_bench_record_function", cpp_sources=[_SOURCE + """
#include <torch/extension.h>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add", &cb_add); m.def("remove", &cb_remove); m.def("counted", &cb_counted);
}"""], extra_cflags=["-O2"], verbose=False)


def iteration(x, w):
    h = (x * 2 + 1).relu()
    h = h.view(-1, h.shape[-1]).transpose(0, 1).contiguous().transpose(0, 1)
    y = (h @ w).sigmoid() * h.sum(-1, keepdim=True)
    y.mean().backward()


def run(n, x, w, sync):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        iteration(x, w)
    sync()
    return (time.perf_counter() - t0) / n


def timed(mode, ext, n, x, w, sync, device, path):
    if mode == "off":
        return run(n, x, w, sync)
    if mode == "empty-callback":
        ext.add(False)
        try:
            return run(n, x, w, sync)
        finally:
            ext.remove()
    if mode in ("torch-history", "torch-history-cpp"):
        torch.cuda.memory._record_memory_history(max_entries=10_000_000,
                                                 stacks="python" if mode == "torch-history" else "all")
        try:
            return run(n, x, w, sync)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    stacks, ops = {"allocscope-nostacks-noops": ("none", False), "allocscope-nostacks-ops": ("none", True),
                   "allocscope-stacks-noops": ("python", False), "allocscope-stacks-ops": ("python", True)}[mode]
    with allocscope.record(path, device=device, stacks=stacks, ops=ops):
        return run(n, x, w, sync)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--gpu", help="run on this virtual GPU")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out")
    a = parser.parse_args()
    on_virtual_gpu(a.gpu)
    device = "cuda" if a.gpu else a.device
    ext = compiled()
    torch.manual_seed(0)
    x = torch.randn(8, 16, 32, device=device, requires_grad=True)
    w = torch.randn(32, 32, device=device, requires_grad=True)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    run(50, x, w, sync)  # warm up
    ext.add(True)
    run(1, x, w, sync)
    ops_per_iteration = ext.counted()
    ext.remove()
    modes = ["off", "empty-callback", "allocscope-nostacks-noops", "allocscope-nostacks-ops",
             "allocscope-stacks-noops", "allocscope-stacks-ops"]
    modes += ["torch-history", "torch-history-cpp"] if device == "cuda" else []
    path = os.path.join(tempfile.mkdtemp(), "ops.alsc")
    samples = {m: [] for m in modes}
    for _ in range(a.rounds):
        for m in modes:
            samples[m].append(timed(m, ext, a.iterations, x, w, sync, device, path))
    best = {m: min(v) for m, v in samples.items()}
    with allocscope.record(path, device=device):
        run(10, x, w, sync)
    allocs = allocscope.load(path).events.counts().get("alloc", 0) / 10
    emit({"benchmark": "op_cost", **environment(), "device": device, "iterations": a.iterations,
          "rounds": a.rounds, "ops_per_iteration": ops_per_iteration, "allocations_per_iteration": allocs,
          "us_per_iteration": {m: round(v * 1e6, 2) for m, v in best.items()},
          "ns_per_op_over_off": {m: round((v - best["off"]) * 1e9 / ops_per_iteration, 1)
                                 for m, v in best.items() if m != "off"},
          "ops_cost_ns_per_op": {  # what op recording adds, with and without Python stacks
              "without_stacks": round((best["allocscope-nostacks-ops"] - best["allocscope-nostacks-noops"])
                                      * 1e9 / ops_per_iteration, 1),
              "with_stacks": round((best["allocscope-stacks-ops"] - best["allocscope-stacks-noops"])
                                   * 1e9 / ops_per_iteration, 1)},
          # The alternative: the op read from each allocation's native stack, unwound there (torch's
          # DWARF unwinder, as torch's recorder does with stacks="all"), per allocation.
          **({"cpp_unwind_ns_per_allocation": round((best["torch-history-cpp"] - best["torch-history"])
                                                    * 1e9 / allocs, 1)} if "torch-history-cpp" in best else {})},
         a.out)


if __name__ == "__main__":
    main()
