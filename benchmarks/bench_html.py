"""How long `allocscope html` takes on large captures, how big the page is,
and how fast it opens in a headless Chromium; prints JSON.

Captures are synthetic CUDA training loops (tests/support/training_run.py: a
watched 24-layer model with labelled parameters, activations, gradients,
Adam state, phases, module scopes and a mark per step; addresses and
segment events from the allocator model, so the report's replay is exact).
Times load() and the whole HTML report (attribution, report, views,
rendering, writing) separately, single runs (the 10M case takes half a
minute), then opens the page in Chromium (tests/browser.py) and times it
from navigation to drawn.

    python benchmarks/bench_html.py [--events 100000 1000000 10000000] [--out FILE]
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import allocscope  # noqa: E402
from _common import emit, environment  # noqa: E402
from tests.support.training_run import training_run  # noqa: E402
from allocscope.reports.html import write_html  # noqa: E402
from tests.browser import Chromium, find_chromium  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out")
    args = ap.parse_args()
    exe = find_chromium()
    browser = Chromium(exe) if exe else None
    results = []
    try:
        with tempfile.TemporaryDirectory() as d:
            for n in args.events:
                cap_path, html_path = os.path.join(d, f"{n}.alsc"), os.path.join(d, f"{n}.html")
                info = training_run(cap_path, n, device=args.device)
                t = time.perf_counter()
                cap = allocscope.load(cap_path, progress=False)
                load_s = time.perf_counter() - t
                t = time.perf_counter()
                size = write_html(cap, html_path, progress=False)
                html_s = time.perf_counter() - t
                row = {"events": info["events"], "steps": info["steps"], "capture_mib": round(os.path.getsize(cap_path) / 2**20, 1),
                       "load_s": round(load_s, 2), "html_s": round(html_s, 2), "total_s": round(load_s + html_s, 2),
                       "html_kib": round(size / 1024, 1)}
                if browser:
                    opens = [browser.open(html_path) for _ in range(3)]
                    row["browser_open_s"] = round(min(opens), 3)
                    row["browser_errors"] = browser.console_errors()
                    row["network_requests"] = [u for u in browser.requests() if not u.startswith("file://")]
                results.append(row)
                del cap
    finally:
        if browser:
            browser.close()
    emit({"benchmark": "html", **environment(), "device_kind": args.device,
          "browser": os.path.basename(exe) if exe else None,
          "what": "load + allocscope html of a synthetic watched CUDA training loop; page opened in headless "
                  "Chromium (navigation to drawn, best of 3)", "goal": "10M events < 30 s, < 5 MB, opens < 2 s",
          "results": results}, args.out)


if __name__ == "__main__":
    main()
