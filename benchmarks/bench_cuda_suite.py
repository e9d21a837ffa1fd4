"""How long the `cuda` tests take on the virtual GPU, and the host memory
they need; prints JSON.

    python benchmarks/bench_cuda_suite.py [--gpu H100-80GB] [--out FILE]

Runs `pytest -m cuda --vgpu GPU tests` once with the Python running this
(so a torch 2.11 environment measures torch 2.11), from the repository root.
"""

import argparse
import os
import resource
import subprocess
import sys
import time

from _common import emit, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "pytest", "-q", "tests", "-m", "cuda", "--vgpu", args.gpu, "--tb=short",
           "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    emit({
        "benchmark": "cuda_suite",
        **environment(),
        "pytest": " ".join(cmd[1:]),
        "exit": result.returncode,
        "outcome": tail,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(children.ru_utime + children.ru_stime, 1),
        "max_rss_mib_of_a_process": round(children.ru_maxrss / 1024, 1),
    }, args.out)


if __name__ == "__main__":
    main()
