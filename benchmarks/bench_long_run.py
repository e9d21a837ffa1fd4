"""Does a long recording stay bounded? Prints JSON (issue 14, "long runs").

Records a watched training loop (a small transformer, AdamW, Python stacks
and ops, a mark per step) for many steps, and samples after every `--every`
steps: the capture's size on disk, the process's resident memory, and the
time per step. A recording that interns its stacks and keeps no per-event
state grows its file by the same bytes every step and its memory not at all
once warm; the summary compares the first and the second half of the run.

    python benchmarks/bench_long_run.py [--steps 4000] [--every 250] [--mode watch|record|off]
                                        [--gpu H100-80GB] [--out FILE]
"""

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import emit, environment, on_virtual_gpu  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--gpu", help="run on this virtual GPU (allocscope.vgpu presets)")
    parser.add_argument("--mode", choices=("watch", "record", "off"), default="watch",
                        help="watch (default): recording and rec.watch; record: recording only; off: neither (control)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    on_virtual_gpu(args.gpu)

    import torch
    from torch import nn

    import allocscope

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(512, 64), nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True),
                          nn.Linear(64, 512)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 512, (4, 32), device=device)
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "long.alsc")
        with contextlib.ExitStack() as stack:
            rec = None if args.mode == "off" else stack.enter_context(
                allocscope.record(path, device=device, stacks="python"))
            if args.mode == "watch":
                rec.watch(model, opt)
            t0 = time.perf_counter()
            for step in range(1, args.steps + 1):
                loss = model(tokens).float().logsumexp(-1).mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if rec is not None:
                    rec.mark(f"step {step}")
                if step % args.every == 0:
                    now = time.perf_counter()
                    size = os.path.getsize(path) if rec is not None else 0
                    samples.append({"step": step, "file_bytes": size, "rss_mib": round(rss_mib(), 1),
                                    "ms_per_step": round((now - t0) * 1000 / args.every, 3)})
                    t0 = now
        final_bytes = os.path.getsize(path) if args.mode != "off" else 0
        events = len(allocscope.load(path).events) if args.mode != "off" else 0
    half = len(samples) // 2
    first, mid, last = samples[0], samples[half], samples[-1]
    steps_first = mid["step"] - first["step"]
    steps_second = last["step"] - mid["step"]
    summary = {
        "events": events, "file_bytes": final_bytes, "events_per_step": round(events / args.steps, 1),
        "bytes_per_step_first_half": round((mid["file_bytes"] - first["file_bytes"]) / max(steps_first, 1), 1),
        "bytes_per_step_second_half": round((last["file_bytes"] - mid["file_bytes"]) / max(steps_second, 1), 1),
        "rss_growth_mib_first_half": round(mid["rss_mib"] - first["rss_mib"], 1),
        "rss_growth_mib_second_half": round(last["rss_mib"] - mid["rss_mib"], 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    emit({"benchmark": "long_run", **environment(), "device": device, "mode": args.mode, "steps": args.steps,
          "what": __doc__.splitlines()[0], "summary": summary, "samples": samples}, args.out)


if __name__ == "__main__":
    main()
