"""What a watched forward's saved-tensor hook costs per saved tensor; prints JSON.

    python benchmarks/bench_saved_hook.py [--gpu H100-80GB] [--rounds 15] [--out FILE]

A deep MLP of small layers (many saved tensors, little arithmetic), trained
for a few steps inside a recording (ops off, nothing else watched), with:
  none     no saved-tensor hooks
  empty    torch.autograd.graph.saved_tensors_hooks with Python functions that
           only detach: torch's hook mechanism itself (a call with the GIL per
           pack and per unpack)
  python   the watcher's hook in Python (recording.watcher.PythonSavedTensorLabeler)
  native   the watcher's hook in C++ (csrc/recorder/saved.h)
Modes interleave over rounds; the fastest round of each is reported, per step
and per saved tensor (a step's saved tensors counted from the recording).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import types

import torch
from torch import nn

import allocscope
from allocscope.common.native import native
from allocscope.recording.saved_reference import PythonSavedTensorLabeler
from _common import emit, environment, on_virtual_gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", help="run on this virtual GPU")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    on_virtual_gpu(args.gpu)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(64, 64), nn.GELU())]).to(device)
    x = torch.randn(8, 64, device=device)
    path = os.path.join(tempfile.mkdtemp(), "saved.alsc")

    def steps(n: int) -> None:
        for _ in range(n):
            model(x).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(mode: str) -> float:
        with allocscope.record(path, device=device, ops=False):
            # a stand-in for the Watch the Python hook reads (its devices, thread-local modules, annotate)
            watch = types.SimpleNamespace(_device_types={device}, _local=types.SimpleNamespace(), name="mlp",
                                          _annotate=native().annotate)
            hooks = {"none": None, "empty": (lambda t: t.detach(), lambda t: t),
                     "python": PythonSavedTensorLabeler(watch),
                     "native": native().SavedTensorLabeler(device == "cuda", device == "cpu", "mlp",
                                                           [torch.Tensor, torch.nn.Parameter])}[mode]
            if hooks is not None and not isinstance(hooks, tuple):
                hooks = (hooks.pack, hooks.unpack)
            ctx = torch.autograd.graph.saved_tensors_hooks(*hooks) if hooks else None
            if ctx is not None:
                ctx.__enter__()
            try:
                steps(2)
                t0 = time.perf_counter()
                steps(args.steps)
                return (time.perf_counter() - t0) / args.steps
            finally:
                if ctx is not None:
                    ctx.__exit__(None, None, None)

    modes = ["none", "empty", "python", "native"]
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            samples[m].append(timed(m))
    # saved tensors per step: the ACTIVATION labels of one step with the native hook (each storage once a step)
    with allocscope.record(path, device=device, ops=False):
        lab = native().SavedTensorLabeler(device == "cuda", device == "cpu", "mlp", [torch.Tensor, torch.nn.Parameter])
        with torch.autograd.graph.saved_tensors_hooks(lab.pack, lab.unpack):
            model(x).sum().backward()
    saved = int((allocscope.load(path).events.kind == allocscope.EventKind.ACTIVATION).sum())
    best = {m: min(v) for m, v in samples.items()}
    emit({"benchmark": "saved_hook", **environment(), "device": device, "layers": args.layers, "steps": args.steps,
          "rounds": args.rounds, "saved_storages_per_step": saved,
          "step_us": {m: round(v * 1e6, 1) for m, v in best.items()},
          "us_per_saved_storage_over_none": {m: round((best[m] - best["none"]) * 1e6 / saved, 3)
                                             for m in modes if m != "none"}}, args.out)


if __name__ == "__main__":
    main()
