"""How fast each analysis stage runs on large captures, and how much memory
it takes; prints JSON (issue 14's "a million events per second").

Captures are synthetic CUDA training loops (tests/support/training_run.py;
their replay is exact). Each stage runs in a fresh process, so its peak
resident memory (VmHWM) is its own, load included:
  load         allocscope.load
  replay       load + allocator.replay.replay (the whole capture)
  attribution  load + attribution.attribute + timeline
  report       load + reports.build_report (replays as far as the report needs)
  html         load + reports.html.write_html
  steps        report --steps 100-120: the partial load (load(through_step=120))
               and the report of those steps; its seconds include the load
  at_early     report --at "step 5": the partial load (load(at_mark=...)) and
               the report at that mark; its seconds include the load
  at_late      the same at the last step's mark
Times are the stage alone (load subtracted where it is part of the process),
one run each: wall seconds, and the CPU's user and system seconds (system
time, mostly fresh memory mapped in, moves by tens of percent from run to
run on the virtual machines this runs on; user time is steadier). Each
stage's process takes memory as `python -m allocscope` does
(common/heap.py: no huge pages, freed memory reused); --heap default
measures numpy's and glibc's defaults instead.

    python benchmarks/bench_analysis.py [--events 1000000 10000000] [--heap default] [--out FILE]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _common import emit, environment  # noqa: E402

STAGES = ("load", "replay", "attribution", "report", "html", "steps", "at_early", "at_late")
STEPS = (100, 120)  # the steps stage reports on these


def _peak_rss_kib() -> int:
    """This process's peak resident memory. Linux's VmHWM starts afresh at
    exec; ru_maxrss does not (a child would report the parent's peak, here
    the parent that wrote a 10M-event capture)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def stage(heap: str, name: str, path: str, mark: str | None = None) -> dict:
    """In this process: the stage's seconds (load apart) and peak memory.
    heap: "command" (as python -m allocscope) or "default"; mark: the at_
    stages' label."""
    import allocscope

    if heap == "command":
        from allocscope.common.heap import reuse_freed_memory

        reuse_freed_memory()

    times0 = os.times()
    t0 = time.perf_counter()
    cap = allocscope.load(path, through_step=STEPS[1] if name == "steps" else None, at_mark=mark)
    t1 = time.perf_counter()
    times1 = os.times()
    if name == "replay":
        from allocscope.allocator.replay import replay

        exact = bool(replay(cap).fidelity.exact)
    elif name == "attribution":
        from allocscope.attribution import attribute, timeline

        timeline(attribute(cap))
    elif name == "report":
        from allocscope.reports import build_report

        build_report(cap)
    elif name == "steps":
        from allocscope.reports import build_report

        build_report(cap, steps=STEPS)
    elif name.startswith("at_"):
        from allocscope.reports import build_report

        build_report(cap, at=mark)
    elif name == "html":
        from allocscope.reports.html import write_html

        write_html(cap, os.path.join(os.path.dirname(path), "out.html"))
    t2 = time.perf_counter()
    times2 = os.times()
    partial = name == "steps" or name.startswith("at_")
    seconds = t1 - t0 if name == "load" else t2 - t0 if partial else t2 - t1
    out = {"load_s": round(t1 - t0, 2), "seconds": round(seconds, 2), "peak_rss_mib": round(_peak_rss_kib() / 1024, 1)}
    # CPU time, as the seconds count: user (the analysis's own work) and
    # system (mostly the kernel mapping fresh memory, which moves by tens of
    # percent from run to run on these virtual machines)
    first = times0 if name == "load" or partial else times1
    out["user_s"] = round(times2.user - first.user, 2)
    out["system_s"] = round(times2.system - first.system, 2)
    if partial:
        out["events_read"] = len(cap.events)
    if name == "replay":
        out["exact"] = exact
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--heap", choices=("command", "default"), default="command",
                        help="memory settings of each stage's process: the command's (default) or numpy's and glibc's")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--stage", nargs="+", help=argparse.SUPPRESS)  # (name, path[, mark]): one stage, in a child
    args = parser.parse_args()
    if args.stage:
        print(json.dumps(stage(args.heap, *args.stage)))
        return
    from tests.support.training_run import training_run

    results = []
    for n in args.events:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.alsc")
            info = training_run(path, n)
            events = info.get("events", n)
            row = {"events": events, "capture_mib": round(os.path.getsize(path) / 2**20, 1)}
            marks = {"at_early": "step 5", "at_late": f"step {info['steps'] - 1}"}
            for name in STAGES:
                proc = subprocess.run([sys.executable, __file__, "--heap", args.heap, "--stage", name, path,
                                       *([marks[name]] if name in marks else [])], capture_output=True, text=True)
                if proc.returncode != 0:
                    row[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                r["events_per_s"] = round(r.get("events_read", events) / r["seconds"]) if r["seconds"] else None
                row[name] = r
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    emit({"benchmark": "analysis", **environment(), "what": __doc__.splitlines()[0],
          "goal": "each stage >= 1M events/s on 2 cores, memory bounded; HTML of 10M events < 15 s",
          "heap": args.heap, "results": results}, args.out)


if __name__ == "__main__":
    main()
