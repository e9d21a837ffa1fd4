"""Any step of a long run: how long `allocscope report --steps S` and
`--at MARK` take at early, middle and late steps of a long capture; prints
JSON (issue 29, "any step of a long run in a second").

Records a watched training loop (the small ResNet-style CNN of bench_step.py,
on the CPU, Python stacks and ops, a mark per step, a checkpoint every
--checkpoint-every events) for --steps steps (3,000 make about 9.3 million
events), then times each report in a fresh process (`allocscope report FILE
--steps S --json`, and `--at "step S"`): wall time and peak resident
memory; and what the checkpoints cost in the file. --capture reuses a
capture made before.

    python benchmarks/bench_steps.py [--steps 3000] [--checkpoint-every N] [--capture FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

import allocscope
from _common import emit, environment
from allocscope.capture.checkpoints import find
from allocscope.recording.session import CHECKPOINT_EVERY
from bench_step import workloads


def record(path: str, steps: int, checkpoint_every: int) -> None:
    torch.manual_seed(0)
    model, make_input, loss_fn, _ = workloads("cpu", True)["resnet"]
    opt = torch.optim.AdamW(model.parameters())
    with allocscope.record(path, device="cpu", checkpoint_every=checkpoint_every) as rec:
        rec.watch(model, opt)
        for step in range(steps):
            x = make_input()
            loss_fn(model(*x), x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            allocscope.mark(f"step {step}")


# Runs the CLI and reports its own peak resident memory: VmHWM, which exec
# resets (ru_maxrss, the parent's RUSAGE_CHILDREN included, keeps what the
# forked copy of this benchmark's process held before exec).
_CLI = ("import sys\n"
        "from allocscope.cli import main\n"
        "try:\n"
        "    code = main(sys.argv[1:])\n"
        "finally:\n"
        "    hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
        "    print('BENCH_RSS', hwm[0] if hwm else 0, file=sys.stderr)\n"
        "sys.exit(code)\n")


def timed(args: list[str]) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CLI, "report", *args, "--json"], capture_output=True, text=True)
    row = {"seconds": round(time.perf_counter() - t0, 2), "exit": out.returncode}
    rss = [line.split()[1] for line in out.stderr.splitlines() if line.startswith("BENCH_RSS ")]
    if rss:
        row["max_rss_mib"] = round(int(rss[-1]) / 1024, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY,
                        help=f"events between checkpoints (default {CHECKPOINT_EVERY}; 0: none)")
    parser.add_argument("--capture", help="a capture of this benchmark's loop made before")
    parser.add_argument("--out")
    a = parser.parse_args()
    path = a.capture
    if path is None:
        path = os.path.join(tempfile.mkdtemp(), "steps.alsc")
        t0 = time.perf_counter()
        record(path, a.steps, a.checkpoint_every)
        record_s = round(time.perf_counter() - t0, 1)
    else:
        record_s = None
    cap = allocscope.load(path)
    events, steps = len(cap.events), a.steps
    rows = {}
    for where, step in (("early", 10), ("middle", steps // 2), ("late", steps - 10)):
        rows[where] = {"step": step, "steps": timed([path, "--steps", str(step)]),
                       "at": timed([path, "--at", f"step {step}"])}
        print(where, rows[where], file=sys.stderr)
    size = os.path.getsize(path)
    checkpoints = {"count": len(find(memoryview(open(path, "rb").read()))),
                   "bytes": cap.chunk_bytes.get("checkpoint", 0)}
    checkpoints["bytes_per_event"] = round(checkpoints["bytes"] / events, 3)
    checkpoints["share_of_file"] = round(checkpoints["bytes"] / size, 4)
    emit({"benchmark": "steps", **environment(), "steps": steps, "events": events,
          "file_bytes": size, "bytes_per_event": round(size / events, 2), "checkpoints": checkpoints,
          "record_seconds": record_s, "reports": rows}, a.out)


if __name__ == "__main__":
    main()
