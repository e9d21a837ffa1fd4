"""How long `allocscope report` takes on captures of a watched training loop;
prints JSON.

Records a real watched training loop (the small ResNet-style CNN of
bench_step.py, on the CPU, with Python stacks) for S steps, then times
load + build_report (the whole JSON report: attribution, peak, theory and
waterfall, iterations, sites, timeline), best of 3.

    python benchmarks/bench_report.py [--steps 40 400] [--out FILE]
"""

import argparse
import os
import tempfile
import time

import torch

import allocscope
from _common import emit, environment
from allocscope.reports import build_report
from bench_step import run_steps, workloads


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[40, 400])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, make_input, loss_fn, _ = workloads("cpu", True)["resnet"]
    opt = torch.optim.AdamW(model.parameters())
    tmp = tempfile.mkdtemp()
    results = []
    for steps in args.steps:
        path = os.path.join(tmp, f"report{steps}.alsc")
        with allocscope.record(path, device="cpu") as rec:
            rec.watch(model, opt)
            run_steps(model, opt, make_input, loss_fn, steps, "cpu")
        load_s = report_s = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            cap = allocscope.load(path)
            t1 = time.perf_counter()
            report = build_report(cap)
            t2 = time.perf_counter()
            load_s, report_s = min(load_s, t1 - t0), min(report_s, t2 - t1)
        results.append({"steps": steps, "events": len(cap.events), "file_mib": round(os.path.getsize(path) / 2**20, 2),
                        "load_s": round(load_s, 3), "report_s": round(report_s, 3),
                        "events_per_s": int(len(cap.events) / report_s), "iterations": len(report["iterations"])})
        os.remove(path)
    emit({"benchmark": "report", **environment(),
          "what": "load + build_report of a watched CPU training loop (small ResNet-style CNN), best of 3",
          "results": results}, args.out)


if __name__ == "__main__":
    main()
