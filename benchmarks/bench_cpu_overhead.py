"""Per-allocation cost of recording on the CPU; prints JSON.

Times `torch.empty(16)` (one allocation and one free) in a loop, called from a
stack of a given depth, with no recording, recording without stacks, and
recording with Python stacks, each with op recording (the default: the op
behind each allocation, and its RecordFunction callback on every op) and
without it (the `-noops` modes). Modes are interleaved over many short rounds.
Reported: the minimum over rounds (interference from a shared machine only
adds time, so the minimum is the steadiest estimate) and the median.

    python benchmarks/bench_cpu_overhead.py [--n 20000] [--rounds 40] [--out FILE]
"""

import argparse
import os
import statistics
import tempfile
import time

import torch

import allocscope
from _common import emit, environment


def nested(depth, fn):
    return fn() if depth == 0 else nested(depth - 1, fn)


def loop(n):
    empty = torch.empty
    t0 = time.perf_counter_ns()
    for _ in range(n):
        empty(16)
    return (time.perf_counter_ns() - t0) / n


def measure(mode, n, depth, path):
    if mode == "off":
        return nested(depth, lambda: loop(n))
    stacks, _, noops = mode.partition("-")
    with allocscope.record(path, device="cpu", stacks=stacks, ops=not noops):
        return nested(depth, lambda: loop(n))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--depths", type=int, nargs="+", default=[5, 40])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = os.path.join(tempfile.mkdtemp(), "bench.alsc")
    modes = ["off", "none", "python", "none-noops", "python-noops"]
    recorded = modes[1:]
    results = []
    for depth in args.depths:
        samples = {m: [] for m in modes}
        measure("python", 1000, depth, path)  # warm up (first stacks, symbolization)
        for _ in range(args.rounds):
            for m in modes:
                samples[m].append(measure(m, args.n, depth, path))
        low = {m: min(v) for m, v in samples.items()}
        med = {m: statistics.median(v) for m, v in samples.items()}
        results.append({
            "stack_depth": depth,
            "ns_per_alloc_free_min": {m: round(v, 1) for m, v in low.items()},
            "overhead_ns_min": {m: round(low[m] - low["off"], 1) for m in recorded},
            "ns_per_alloc_free_median": {m: round(v, 1) for m, v in med.items()},
            "overhead_ns_median": {m: round(med[m] - med["off"], 1) for m in recorded},
        })
    cap = allocscope.load(path)
    report = {
        "benchmark": "cpu_overhead",
        **environment(),
        "what": "ns per torch.empty(16) call (one allocation + one free): minimum and median over rounds",
        "stack_walker": cap.metadata["recorder"]["stack_walker"],
        "n_per_round": args.n,
        "rounds": args.rounds,
        "results": results,
        "file_bytes_per_event_events_only": round(cap.chunk_bytes["events"] / len(cap.events), 2),
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
