"""Step time of real training steps with and without recording; prints JSON.

Models built in code (no downloads): a small GPT-style transformer and a
ResNet-style CNN. Modes, interleaved over rounds (median reported):
  off               no recording
  allocscope-none   allocscope, no stacks
  allocscope-noops  allocscope, Python stacks, no op recording: what record() records by default where
                    nothing is watched (ops=None records ops from the first watch() on)
  allocscope-python allocscope, Python stacks and ops from the start (ops=True; the default before 2026-11-25)
  allocscope-watch  allocscope, Python stacks, ops, and rec.watch(model, optimizer) (the default's watch)
  allocscope-watch-noops  the same without op recording (backward scopes from
                    Python hooks on autograd nodes instead of the op callback)
  allocscope-watch-pypack  allocscope-watch with the saved-tensor hook in Python (the watcher's before
                    2026-11-25: recording.watcher.PythonSavedTensorLabeler) instead of C++
  allocscope-watch-pyroute  allocscope-watch with the (C) saved-tensor hook called through torch's Python
                    mechanism (the watcher's before 2026-11-26: Watch.saved_hooks_in_cpp = False) instead
                    of through allocscope's autograd engine (csrc/recorder/saved_engine.h)
  allocscope-watch-pygrads  allocscope-watch with gradients labelled by a Python hook per parameter (the
                    watcher's before 2026-11-25: Watch.native_gradients = False) instead of by the op callback
  allocscope-watch-nocheckpoints  allocscope-watch with checkpoint_every=0: the
                    writer thread does not follow the live set (what checkpoints cost)
  torch-history     torch.cuda.memory._record_memory_history(stacks="python") (CUDA only)
  torch-history-cpp the same with stacks="all": Python and C++ stacks, the C++ ones unwound at every
                    allocation by torch's own DWARF unwinder (torch::unwind) (CUDA only). Its cost over
                    torch-history is what naming each allocation's op from its native stack would cost,
                    against allocscope's per-op callback (allocscope-python over allocscope-noops)
Also compares file sizes: an allocscope capture of the measured steps against
torch's _dump_snapshot pickle of the same steps.

    python benchmarks/bench_step.py                 # on CUDA (the numbers that matter)
    python benchmarks/bench_step.py --gpu H100-80GB # on the virtual GPU: kernels cost nothing, so this is
                                                    # the CPU time each recorder adds to a step
    python benchmarks/bench_step.py --device cpu --small   # smoke run anywhere
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from torch import nn

import allocscope
from allocscope.recording.session import CHECKPOINT_EVERY
from allocscope.recording.saved_reference import PythonSavedTensorLabeler
from allocscope.recording.watcher import Watch
from _common import emit, environment, on_virtual_gpu


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(self.ln(x))


class ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                  nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet(width):
    layers, c = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()], width
    for i, mult in enumerate((1, 2, 4, 8)):
        layers += [ResBlock(c, width * mult, 1 if i == 0 else 2), ResBlock(width * mult, width * mult, 1)]
        c = width * mult
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 100))


def workloads(device, small):
    if small:
        gpt = dict(vocab=512, d=64, layers=2, heads=4, seq=32, batch=4)
        cnn = dict(width=8, batch=4, size=32)
    else:
        gpt = dict(vocab=8192, d=512, layers=8, heads=8, seq=256, batch=16)
        cnn = dict(width=64, batch=64, size=64)
    g = GPT(gpt["vocab"], gpt["d"], gpt["layers"], gpt["heads"], gpt["seq"]).to(device)
    r = resnet(cnn["width"]).to(device)
    return {
        "gpt": (g, lambda: (torch.randint(0, gpt["vocab"], (gpt["batch"], gpt["seq"]), device=device),),
                lambda out, x: nn.functional.cross_entropy(out.flatten(0, 1), x[0].flatten()), gpt),
        "resnet": (r, lambda: (torch.randn(cnn["batch"], 3, cnn["size"], cnn["size"], device=device),),
                   lambda out, x: out.logsumexp(1).mean(), cnn),
    }


def run_steps(model, opt, make_input, loss_fn, steps, device, clock=time.perf_counter):
    """Seconds per step by `clock`: wall time, or time.process_time (the CPU time of every thread of
    the process: steadier than wall time on a shared machine, and on the virtual GPU, where kernels
    cost nothing, the same cost)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = clock()
    for _ in range(steps):
        x = make_input()
        loss = loss_fn(model(*x), x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return (clock() - t0) / steps


def timed(mode, model, opt, make_input, loss_fn, steps, device, path, snapshot_path=None):
    if mode == "off":
        return run_steps(model, opt, make_input, loss_fn, steps, device), None
    if mode == "allocscope-watch-pygrads":
        return timed_watch_pygrads(model, opt, make_input, loss_fn, steps, device, path)
    if mode in ("torch-history", "torch-history-cpp"):
        torch.cuda.memory._record_memory_history(max_entries=10_000_000,
                                                 stacks="python" if mode == "torch-history" else "all")
        try:
            t = run_steps(model, opt, make_input, loss_fn, steps, device)
            if snapshot_path:
                torch.cuda.memory._dump_snapshot(snapshot_path)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        return t, None
    stacks = "none" if mode == "allocscope-none" else "python"
    ops = mode not in ("allocscope-noops", "allocscope-watch-noops")
    every = 0 if mode == "allocscope-watch-nocheckpoints" else CHECKPOINT_EVERY
    with allocscope.record(path, device=device, stacks=stacks, ops=ops, checkpoint_every=every) as rec:
        if mode.startswith("allocscope-watch"):
            Watch.saved_hooks_in_cpp = mode != "allocscope-watch-pyroute"
            try:
                w = rec.watch(model, opt)
            finally:
                Watch.saved_hooks_in_cpp = True
            if mode == "allocscope-watch-pypack":
                w._saved = PythonSavedTensorLabeler(w)
        t = run_steps(model, opt, make_input, loss_fn, steps, device)
    return t, rec.summary


def timed_watch_pygrads(model, opt, make_input, loss_fn, steps, device, path):
    Watch.native_gradients = False
    try:
        with allocscope.record(path, device=device, checkpoint_every=CHECKPOINT_EVERY) as rec:
            rec.watch(model, opt)
            t = run_steps(model, opt, make_input, loss_fn, steps, device)
    finally:
        Watch.native_gradients = True
    return t, rec.summary


def _overhead_ratio(med: dict, mode: str, other: str) -> float | None:
    """mode's overhead over other's; None where either was not timed, or other's is not above noise
    (a card hides CPU time)."""
    if mode not in med or other not in med:
        return None
    below = med[other] - med["off"]
    return round((med[mode] - med["off"]) / below, 2) if below > 0.005 * med["off"] else None


def _pct(med: dict, mode: str, other: str) -> float | None:
    return round(100 * (med[mode] / med[other] - 1), 2) if mode in med and other in med else None


def _ms(med: dict, mode: str, other: str) -> float | None:
    return round((med[mode] - med[other]) * 1e3, 3) if mode in med and other in med else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="tiny models (smoke test)")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--gpu", help="run on this virtual GPU (allocscope run --gpu list)")
    parser.add_argument("--modes", help="comma-separated modes to time (default: all; `off` is always timed; "
                                        "ratios whose modes are left out are null)")
    args = parser.parse_args()
    on_virtual_gpu(args.gpu)
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "step.alsc")
    modes = ["off", "allocscope-none", "allocscope-noops", "allocscope-python", "allocscope-watch",
             "allocscope-watch-noops", "allocscope-watch-pypack", "allocscope-watch-pyroute",
             "allocscope-watch-pygrads",
             "allocscope-watch-nocheckpoints"]
    modes += ["torch-history", "torch-history-cpp"] if args.device == "cuda" else []
    if args.modes:
        unknown = set(args.modes.split(",")) - set(modes)
        if unknown:
            parser.error(f"--modes: unknown here: {', '.join(sorted(unknown))} (modes: {', '.join(modes)})")
        modes = ["off"] + [m for m in modes if m != "off" and m in args.modes.split(",")]
    results = {}
    for name, (model, make_input, loss_fn, config) in workloads(args.device, args.small).items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        run_steps(model, opt, make_input, loss_fn, 3, args.device)  # warm up (cuBLAS/cuDNN, optimizer state)
        samples = {m: [] for m in modes}
        for _ in range(args.rounds):
            for m in modes:
                samples[m].append(timed(m, model, opt, make_input, loss_fn, args.steps, args.device, path)[0])
        med = {m: statistics.median(v) for m, v in samples.items()}
        # File sizes for the same number of steps.
        _, summary = timed("allocscope-python", model, opt, make_input, loss_fn, args.steps, args.device, path)
        cap = allocscope.load(path)
        sizes = {"allocscope_bytes": os.path.getsize(path), "events": len(cap.events),
                 "allocscope_event_bytes_per_event": round(cap.chunk_bytes["events"] / len(cap.events), 2),
                 "allocscope_bytes_per_event": round(os.path.getsize(path) / len(cap.events), 2)}
        if "torch-history" in modes:
            pickle_path = os.path.join(tmp, "snapshot.pickle")
            timed("torch-history", model, opt, make_input, loss_fn, args.steps, args.device, path, pickle_path)
            sizes["torch_snapshot_bytes"] = os.path.getsize(pickle_path)
            sizes["torch_over_allocscope"] = round(sizes["torch_snapshot_bytes"] / sizes["allocscope_bytes"], 1)
        timed("allocscope-watch", model, opt, make_input, loss_fn, args.steps, args.device, path)
        annotations = int((allocscope.load(path).events.kind > allocscope.EventKind.MARK).sum())
        results[name] = {
            "config": config,
            "step_ms": {m: round(v * 1e3, 3) for m, v in med.items()},
            "overhead_pct": {m: round(100 * (med[m] / med["off"] - 1), 2) for m in modes if m != "off"},
            "step_ms_spread": {m: [round(min(v) * 1e3, 3), round(max(v) * 1e3, 3)] for m, v in samples.items()},
            # On a shared 2-core machine interference only adds time: the
            # fastest round of each mode is the steadier figure.
            "overhead_pct_of_fastest": {m: round(100 * (min(v) / min(samples["off"]) - 1), 2)
                                        for m, v in samples.items() if m != "off"},
            "allocations_per_step": round(cap.events.counts().get("alloc", 0) / args.steps, 1),
            "watch_annotations_per_step": round(annotations / args.steps, 1),
            "watch_over_recording_pct": _pct(med, "allocscope-watch", "allocscope-python"),
            "watch_over_recording_noops_pct": _pct(med, "allocscope-watch-noops", "allocscope-noops"),
            "ops_over_stacks_pct": _pct(med, "allocscope-python", "allocscope-noops"),
            "checkpoints_over_watch_pct": _pct(med, "allocscope-watch", "allocscope-watch-nocheckpoints"),
            "native_saved_hook_ms_per_step": _ms(med, "allocscope-watch", "allocscope-watch-pypack"),
            "engine_saved_hooks_ms_per_step": _ms(med, "allocscope-watch", "allocscope-watch-pyroute"),
            "native_gradients_ms_per_step": _ms(med, "allocscope-watch", "allocscope-watch-pygrads"),
            # overheads over torch's recorder's, and watching's over recording's (record()'s defaults:
            # no ops unwatched), as issue 29 asks them
            "default_recording_over_torch": _overhead_ratio(med, "allocscope-noops", "torch-history"),
            "watch_over_default_recording_overhead": _overhead_ratio(med, "allocscope-watch", "allocscope-noops"),
            "recording_over_torch": _overhead_ratio(med, "allocscope-python", "torch-history"),
            "watch_over_recording_overhead": _overhead_ratio(med, "allocscope-watch", "allocscope-python"),
            # per step: what op recording adds to allocscope, and what C++ stacks add to torch's recorder
            "ops_ms_per_step": _ms(med, "allocscope-python", "allocscope-noops"),
            "cpp_stacks_ms_per_step": _ms(med, "torch-history-cpp", "torch-history"),
            "files": sizes,
        }
        del model, opt
    report = {
        "benchmark": "step",
        **environment(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({os.cpu_count()} cpus)",
        "steps": args.steps,
        "rounds": args.rounds,
        "results": results,
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
