"""How fast allocscope.load reads large captures; prints JSON.

Records N events for real (allocations and frees from a native thread, made
by the tests' native harness, tests/native/build.py; the recorder and writer
are the real ones) and times loading the file.

    python benchmarks/bench_load.py [--events 10000000 1000000] [--out FILE]
"""

import argparse
import os
import sys
import tempfile
import time

import allocscope
from _common import emit, environment

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.native import allocscope_testing as harness  # noqa: E402  (the tests' native harness: make test builds it)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    results = []
    tmp = tempfile.mkdtemp()
    for n in args.events:
        path = os.path.join(tmp, f"load{n}.alsc")
        t0 = time.perf_counter()
        with allocscope.record(path, device="cpu", stacks="none"):
            harness.cpu_alloc_from_native_threads(1, n // 2, 64)
        record_s = time.perf_counter() - t0
        size = os.path.getsize(path)
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            cap = allocscope.load(path)
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
        results.append({
            "events": len(cap.events),
            "file_mib": round(size / 2**20, 1),
            "bytes_per_event": round(size / len(cap.events), 2),
            "record_s": round(record_s, 2),
            "load_s": round(best, 2),
            "events_per_s": int(len(cap.events) / best),
        })
        os.remove(path)
    report = {
        "benchmark": "load",
        **environment(),
        "what": "allocscope.load of a real recording (alloc/free pairs, no stacks), best of 3",
        "results": results,
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
