"""What each part of watching costs a training step; prints JSON.

    python benchmarks/bench_watch_parts.py --gpu H100-80GB [--rounds 15] [--out FILE]

(On a GPU or the virtual one: on the CPU the models compute for real, for minutes.)

bench_step.py's GPT and ResNet steps, each timed inside a recording without
ops (record()'s default where nothing is watched) with one part of watching
added alone:
  recording           nothing more
  ops                 the op callback (which watch() turns on)
  saved_hooks_native  the saved-tensor hooks, the watcher's (csrc/recorder/saved.h)
  saved_hooks_python  the saved-tensor hooks with Python functions that only detach
  empty_module_hooks  a forward pre-hook and hook that do nothing on every module
                      (what any hook costs: Module._call_impl's slow path)
  empty_grad_hooks    a post-accumulate-grad hook that does nothing on every parameter
  watch               rec.watch(model, optimizer): all of it
  watch_without_module_scopes  the same without the scopes of every module but the root
                      (their wrapped forwards, recording/module_scopes.py, cost the difference;
                      the root's hooks begin the forward)
Modes interleave over rounds; per step, the median and the fastest round's
milliseconds over no recording, by wall time or (--clock cpu) the CPU time of
every thread of the process, which another process on the machine disturbs less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

import allocscope
from allocscope.common.native import native
from _common import emit, environment, on_virtual_gpu
from bench_step import run_steps, workloads


def measure(name, model, make_input, loss_fn, device, args, path) -> dict:
    """One workload: each part alone, interleaved over rounds."""
    C = native()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run_steps(model, opt, make_input, loss_fn, 3, device)

    def saved(pack, unpack):
        h = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        h.__enter__()
        return lambda: h.__exit__(None, None, None)

    def module_hooks():
        hs = [h for m in model.modules() for h in (m.register_forward_pre_hook(lambda m, a: None),
                                                   m.register_forward_hook(lambda m, a, o: None, always_call=True))]
        return lambda: [h.remove() for h in hs]

    def grad_hooks():
        hs = [p.register_post_accumulate_grad_hook(lambda p: None) for p in model.parameters()]
        return lambda: [h.remove() for h in hs]

    def watch_without_module_scopes(rec):
        from allocscope.recording.global_hooks import GlobalHooks

        w = rec.watch(model, opt)
        root = GlobalHooks.modules.get(model)  # (every module's scopes go but the root's)
        GlobalHooks.modules.filter_values(lambda entries: entries if entries is root else [])
        return w.remove

    def native_saved():
        lab = C.SavedTensorLabeler(device == "cuda", device == "cpu", name, [torch.Tensor, torch.nn.Parameter])
        return saved(lab.pack, lab.unpack)

    parts = {"recording": lambda rec: (lambda: None),
             "ops": lambda rec: (C.start_ops(), lambda: None)[1],
             "saved_hooks_native": lambda rec: native_saved(),
             "saved_hooks_python": lambda rec: saved(lambda t: t.detach(), lambda t: t),
             "empty_module_hooks": lambda rec: module_hooks(),
             "empty_grad_hooks": lambda rec: grad_hooks(),
             "watch": lambda rec: rec.watch(model, opt).remove,
             "watch_without_module_scopes": watch_without_module_scopes}

    def timed(setup):
        with allocscope.record(path, device=device, ops=False) as rec:
            undo = setup(rec)
            run_steps(model, opt, make_input, loss_fn, 2, device)
            t = run_steps(model, opt, make_input, loss_fn, args.steps, device, clock)
            undo()
        return t

    off, samples = [], {m: [] for m in parts}
    for _ in range(args.rounds):
        off.append(run_steps(model, opt, make_input, loss_fn, args.steps, device, clock))
        for m, setup in parts.items():
            samples[m].append(timed(setup))
    o = statistics.median(off)
    return {"off_ms": round(o * 1e3, 3),
            "ms_over_off": {m: round((statistics.median(v) - o) * 1e3, 3) for m, v in samples.items()},
            "fastest_ms_over_fastest_off": {m: round((min(v) - min(off)) * 1e3, 3) for m, v in samples.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", help="run on this virtual GPU")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or the CPU time of every thread of the process")
    parser.add_argument("--out")
    args = parser.parse_args()
    on_virtual_gpu(args.gpu)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = os.path.join(tempfile.mkdtemp(), "parts.alsc")
    results = {}
    for name, (model, make_input, loss_fn, config) in workloads(device, False).items():
        results[name] = {"config": config, **measure(name, model, make_input, loss_fn, device, args, path)}
    emit({"benchmark": "watch_parts", **environment(), "device": device, "clock": args.clock, "rounds": args.rounds,
          "steps": args.steps, "results": results}, args.out)


if __name__ == "__main__":
    main()
