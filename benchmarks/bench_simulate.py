"""How fast the caching-allocator model replays a capture; prints JSON.

Builds synthetic CUDA captures of a training-like loop (per step: a few
hundred activations and temporaries from 512 B to 48 MiB whose sizes vary
from step to step like growing sequence lengths, freed mostly in reverse; a
cross-stream free now and then; empty_cache() every 500 steps). The
"recorded" segment events are made by the model itself with the default
settings, so the timed replay is a faithful one (all fidelity checks on).
Times replay() with the recorded settings and with expandable segments, best
of 3.

    python benchmarks/bench_simulate.py [--events 100000 1000000] [--out FILE]
"""

import argparse
import os
import random
import tempfile
import time

import allocscope
from _common import emit, environment
from allocscope.capture.format import EventKind
from allocscope.capture.writer import CaptureWriter
from allocscope.allocator.config import AllocatorConfig, parse_alloc_conf
from allocscope.allocator.replay import replay
from allocscope.allocator.model import DeviceAllocator

MiB = 1 << 20
TOTAL = 80 << 30


def build(path: str, events: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    b = CaptureWriter({"cuda_devices": [{"index": 0, "total_memory": TOTAL}]}, device=0)
    b.baseline({"label": "start", "device_type": "cuda", "seq": 0, "segments": [], "config": {},
                "devices": [{"index": 0, "free": TOTAL, "total": TOTAL, "used": 0,
                             "stats": {"reserved_bytes": {"current": 0, "peak": 0}}}]})
    model = DeviceAllocator(AllocatorConfig(), total=TOTAL, capacity=TOTAL)
    side = b.stream(0, 7)
    seen = 0

    def flush():
        nonlocal seen
        for e in model.events[seen:]:
            kind = {"segment_alloc": EventKind.SEGMENT_ALLOC, "segment_free": EventKind.SEGMENT_FREE}[e.kind]
            b.event(kind, addr=e.addr, size=e.size)
        seen = len(model.events)

    params = []
    for _ in range(50):
        blk = model.malloc(rng.choice([4 * MiB, 16 * MiB, 64 * KiB]), 0)
        flush()
        b.alloc(blk.addr, blk.requested)
        params.append(blk)
    step = 0
    while len(b.events) < events:
        step += 1
        scale = 1 + (step % 17) / 16  # sequence length grows and wraps
        live = []
        for _ in range(rng.randint(150, 250)):
            size = int(rng.choice([512, 4096, 65536, 1 * MiB, 3 * MiB, 12 * MiB, 48 * MiB]) * scale * rng.random()) + 1
            blk = model.malloc(size, 0)
            flush()
            b.alloc(blk.addr, size)
            live.append(blk)
            if rng.random() < 0.3 and live:
                victim = live.pop(rng.randrange(len(live)))
                b.free(victim.addr)
                model.free(victim)
        for blk in reversed(live):
            deferred = rng.random() < 0.01
            b.free(blk.addr)
            model.free(blk, deferred)
            if deferred:
                b.event(EventKind.FREE_COMPLETED, addr=blk.addr, size=blk.requested, stream=side)
                model.complete(blk)
        if step % 500 == 0:
            b.event(EventKind.EMPTY_CACHE, stream=0)
            model.empty_cache()
            flush()
    b.write(path)
    return step


KiB = 1 << 10


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp()
    results = []
    for n in args.events:
        path = os.path.join(tmp, f"sim{n}.alsc")
        steps = build(path, n)
        cap = allocscope.load(path)
        row = {"events": len(cap.events), "steps": steps}
        for label, cfg in (("recorded", None), ("expandable_segments", parse_alloc_conf("expandable_segments:True"))):
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                rep = replay(cap, cfg)
                best = min(best, time.perf_counter() - t0)
            row[label] = {"replay_s": round(best, 3), "events_per_s": int(len(cap.events) / best),
                          "peak_reserved": rep.peak_reserved}
            if rep.fidelity is not None:
                row[label]["exact"] = rep.fidelity.exact
                row[label]["segment_events"] = rep.fidelity.recorded_segment_events
        results.append(row)
        os.remove(path)
    emit({"benchmark": "simulate", **environment(),
          "what": "replay() of synthetic training-like CUDA captures, best of 3", "results": results}, args.out)


if __name__ == "__main__":
    main()
