"""How long `make test` takes from a fresh clone; prints JSON.

Clones this repository's HEAD into a temporary folder (nothing of this
checkout's builds or virtual environments comes along), runs `make test`
there and reports its wall time, each pytest session's time and counts (from
its summary line), and the time before the first session (set-up: virtual
environments, builds).

    python benchmarks/bench_make_test.py [--out FILE] [--keep]
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = re.compile(r"^(?P<counts>(?:\d+ \w+(?:, )?)+).* in (?P<seconds>[\d.]+)s")
SESSION = re.compile(r"^allocscope tests: (?P<name>.+)$")


def sessions(log: str) -> list[dict]:
    """Each session's name (the line make prints before it), counts and seconds."""
    out, name = [], None
    for line in log.splitlines():
        line = line.strip().strip("=").strip()
        m = SESSION.match(line)
        if m:
            name = m.group("name")
            continue
        m = SUMMARY.match(line)
        if m and name:
            counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed)",
                                                       m.group("counts"))}
            out.append({"session": name, "seconds": float(m.group("seconds")), **counts})
            name = None
    return out


def setup_times(clone: str, started: float) -> dict:
    """Seconds from make's start to the end of each set-up step, from the
    files each step leaves (make's output is printed a target at a time, so
    it cannot say when a target's set-up ended)."""
    marks = {"main_venv": ".venv/.deps", "main_build": ".venv/.built",
             "compat_venv": ".venv-torch2.11.0/.deps"}
    out = {}
    for name, path in marks.items():
        full = os.path.join(clone, path)
        if os.path.exists(full):
            out[name] = round(os.path.getmtime(full) - started, 1)
    # the compat build's last product: the test-only extension tests/native/build.py puts in tests/native
    native = os.path.join(clone, "build-compat", "tests", "native")
    built = [os.path.join(native, f) for f in os.listdir(native) if f.endswith(".so")] if os.path.isdir(native) else []
    if built:
        out["compat_build"] = round(max(os.path.getmtime(f) for f in built) - started, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the clone (and its log) afterwards")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="allocscope-make-test-")
    clone = os.path.join(work, "allocscope")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", ROOT, clone], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    t0 = time.monotonic()
    started = time.time()
    result = subprocess.run(["make", "test"], cwd=clone, capture_output=True, text=True)
    wall = time.monotonic() - t0
    log = result.stdout + result.stderr
    with open(os.path.join(work, "make-test.log"), "w") as f:
        f.write(log)
    found = sessions(log)
    report = {
        "benchmark": "make_test",
        "command": "make test (fresh clone of HEAD)",
        "commit": commit,
        "exit_status": result.returncode,
        "wall_s": round(wall, 1),
        "setup_done_s": setup_times(clone, started),
        "sessions": found,
        "tests_run": sum(s.get("passed", 0) + s.get("failed", 0) for s in found),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "python": platform.python_version(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.keep:
        print(f"kept {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
