"""A watched program keeps the lifetimes it has unwatched (issue 62): a
benchmark that catches an out-of-memory error, builds a fresh model and
retries at a smaller batch (timm's benchmark.py: the failed bench object
is dropped only when the next one is assigned) reaches the same peaks,
holds the same bytes at each source line at the peak, and prints the same,
watched (`allocscope run`, which watches by default) as not
(`--no-watch`), on torch's real allocator on the virtual GPU. The estimate
counts the model alive at the peak, not every model ever watched."""

import json
import subprocess
import sys

import pytest

import allocscope
from allocscope.attribution import attribute
from allocscope.attribution.estimate import theory

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")

RETRY = """\
import sys

import torch
from torch import nn


class Bench:
    def __init__(self, batch):
        self.model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                                   nn.Linear(4096, 1024)).cuda()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.batch = batch

    def run(self):
        for _ in range(2):
            x = torch.randn(self.batch, 1024, device="cuda")
            self.model(x).square().mean().backward()
            self.opt.step()
            self.opt.zero_grad()


batch = int(sys.argv[1])
while batch:
    try:
        torch.cuda.empty_cache()
        bench = Bench(batch)
        bench.run()
        break
    except RuntimeError as e:
        print(f"batch {batch}: {type(e).__name__}")
    batch //= 2
print("done at", batch, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
      torch.cuda.memory_allocated())
"""
PARAMETERS = (1024 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1024 + 1024) * 4


def _run(tmp_path, *options):
    capture = tmp_path / f"retry{''.join(options)}.alsc"
    r = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "H100-80GB", "--gpu-memory", "1GiB",
                        *options, "-f", "-o", str(capture), "--", sys.executable, str(tmp_path / "retry.py"),
                        "16384"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "allocscope", "report", "--json", str(capture)],
                            capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    return r.stdout, json.loads(report.stdout) | {"path": str(capture)}


def _by_line(report):
    """Live bytes at the peak by source line (the watched report's sites
    also name a backward's node: the same line's bytes)."""
    out: dict[str, int] = {}
    for s in report["sites"]:
        line = s["site"].split(" [")[0]
        out[line] = out.get(line, 0) + s["live_bytes"]
    return out


def test_a_model_rebuilt_after_running_out_is_a_new_model(tmp_path):
    (tmp_path / "retry.py").write_text(RETRY)
    plain, plain_report = _run(tmp_path, "--no-watch")
    watched, report = _run(tmp_path)
    # (watched without ops: a backward's allocations keep the stack they have unwatched, none)
    without_ops, without_ops_report = _run(tmp_path, "--no-ops")
    assert plain.count("OutOfMemoryError") >= 2  # (not vacuous: two models were dropped)
    assert watched == plain and without_ops == plain  # the same retries, the same peaks, allocated and reserved
    for key in ("allocated_bytes", "reserved_bytes"):
        assert report["measured"][key] == plain_report["measured"][key] == without_ops_report["measured"][key]
    assert _by_line(without_ops_report) == _by_line(plain_report)
    # With ops, a backward's allocations are its forward's line's: the same bytes in all, the model's line the same
    lines = _by_line(report)
    assert sum(lines.values()) == sum(_by_line(plain_report).values())
    model_line = next(line for line in lines if "(Bench.__init__)" in line)
    assert lines[model_line] == _by_line(plain_report)[model_line] == PARAMETERS
    # One model a try; at the peak one is alive (its optimizer, never stepped, unseen by auto-watch)
    assert report["capture"]["watched"] == ["Sequential"] * (plain.count("OutOfMemoryError") + 1)
    assert report["theory"]["parameters"] == PARAMETERS
    # at the end, the last model and its optimizer, seen at its first step
    att = attribute(allocscope.load(report["path"]))
    at_end = theory(att, len(att.capture.events) - 1)
    assert at_end["parameters"] == PARAMETERS and at_end["optimizer_state"] == PARAMETERS  # SGD's momentum
    # and the memory has its meaning: what is not named is under 1% of the peak
    categories = report["peak"]["by_category"]
    assert categories["parameter"] == PARAMETERS
    assert categories["other"] <= 0.01 * report["peak"]["allocated_bytes"], categories
