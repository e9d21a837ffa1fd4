"""The pytest plugin's gpu_memory marker, run on a sample project in a
subprocess as a user's suite would run it: each marked test runs on the
virtual card in a child process, and passes, fails over its budget (with the
peak's breakdown), fails on an OOM (with the post-mortem), or fails for its
own reasons as it would without the marker."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from allocscope import load

pytestmark = pytest.mark.torch_agnostic

SAMPLE = '''
import json, os
import pytest
import torch
import allocscope


def step(batch):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters())
    allocscope.watch(model, opt)
    x = torch.randn(batch, 1024, device="cuda")
    model(x).sum().backward()
    opt.step()


def peaks(name):
    with open(os.path.join(os.environ["PEAKS_DIR"], name + ".json"), "w") as f:
        json.dump([torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated(),
                   torch.cuda.get_device_name()], f)


@pytest.mark.gpu_memory(gpu="L4-24GB", max_reserved="1GiB")
def test_small_fits():
    step(64)
    peaks("small")


@pytest.mark.gpu_memory(gpu="L4-24GB", max_reserved="1GiB", max_allocated="100GiB")
def test_large_over_budget():
    step(65536)
    peaks("large")


@pytest.mark.gpu_memory("T4-16GB", max_allocated="100GiB")
def test_runs_out():
    step(1 << 20)


@pytest.mark.gpu_memory(gpu="L4-24GB", max_reserved="1GiB")
def test_fails_for_its_own_reason():
    step(64)
    assert 1 + 1 == 3, "an ordinary failure"


@pytest.mark.gpu_memory(gpu="NoSuchGPU", max_reserved="1GiB")
def test_unknown_gpu():
    pass


@pytest.mark.gpu_memory(gpu="L4-24GB", max_reserved="1GiB", routing="worst")
def test_routing_reaches_the_child():
    import torch
    logits = torch.randn(64, 32, device="cuda") @ torch.randn(32, 8, device="cuda")  # not computed
    assert torch.topk(logits, 2).indices.unique().tolist() == [0, 1]  # every token to experts 0 and 1


def test_unmarked():
    assert "ALLOCSCOPE_GPU_MEMORY_CHILD" not in os.environ  # in the suite's own process, not a child
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    project = tmp_path_factory.mktemp("project")
    (project / "test_budget.py").write_text(SAMPLE)
    peaks = project / "peaks"
    peaks.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCSCOPE_")} | {"PEAKS_DIR": str(peaks)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(project)],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    yield proc, {p.stem: json.loads(p.read_text()) for p in peaks.glob("*.json")}
    for capture in set(re.findall(r"capture: (\S+\.alsc)", proc.stdout)):  # the failed tests' (kept for the user)
        shutil.rmtree(os.path.dirname(capture), ignore_errors=True)


def _section(output: str, test: str) -> str:
    """The failure (or error) section of one test in pytest's output."""
    m = re.search(rf"_+ (?:ERROR at setup of )?{test} _+\n(.*?)(?=\n_{{3,}} |\n=+ )", output, re.S)
    assert m, f"no section for {test} in:\n{output}"
    return m.group(1)


def test_outcomes(session):
    proc, peaks = session
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    for outcome, test in [("PASSED", "test_small_fits"), ("FAILED", "test_large_over_budget"),
                          ("FAILED", "test_runs_out"), ("FAILED", "test_fails_for_its_own_reason"),
                          ("ERROR", "test_unknown_gpu"), ("PASSED", "test_unmarked"),
                          ("PASSED", "test_routing_reaches_the_child")]:
        assert re.search(rf"^{outcome} test_budget.py::{test}\b", out, re.M), (test, out)
    # The tests ran on the cards their markers name (the children), not in the suite's process.
    assert peaks["small"][2] == "NVIDIA L4" and peaks["large"][2] == "NVIDIA L4"
    assert 0 < peaks["small"][0] <= 1 << 30 < peaks["large"][0]


def test_over_budget_message(session):
    proc, peaks = session
    text = _section(proc.stdout, "test_large_over_budget")
    reserved, allocated, _ = peaks["large"]
    # The figures are torch's own peaks in the child, to the byte.
    assert ("over its GPU memory budget on the virtual L4-24GB: peak reserved" in text
            and f"({reserved:,} bytes) > max_reserved 1.00 GiB (1,073,741,824 bytes)" in text), text
    assert "max_allocated" not in text.splitlines()[0]  # 100 GiB was not passed
    # What filled memory: the watched model's categories and the source lines.
    assert re.search(r"by category: .*activation", text) and "by module:" in text, text
    assert "test_budget.py:" in text
    capture = re.search(r"capture: (\S+\.alsc)", text).group(1)
    cap = load(capture)  # kept for allocscope report / html
    assert cap.metadata["virtual_gpu"]["devices"][0]["key"] == "L4-24GB"


def test_oom_message(session):
    proc, _ = session
    text = _section(proc.stdout, "test_runs_out")
    assert text.startswith("ran out of GPU memory on the virtual T4-16GB"), text
    assert "Out of memory at event" in text and "short by" in text, text
    assert "During handling of the above exception" not in text
    # in the user's terms (issue 50): where the test was, its own lines first, torch's folded into one line
    assert re.search(r"ran out in the forward of step 0, at .*test_budget\.py:\d+ \(step\)", text), text
    assert re.search(r"module +Sequential\.0 \(Linear\)", text), text
    stack = text.split(" stack ", 1)[1].splitlines()
    assert re.match(r" *step \(.*test_budget\.py:\d+\)$", stack[0]), stack
    assert re.match(r" *\[\+\d+ torch frames inside, innermost ", stack[1]), stack
    assert re.match(r" *test_runs_out \(.*test_budget\.py:\d+\)$", stack[2]), stack
    assert "site-packages/torch" not in "\n".join(stack[2:stack.index(next(s for s in stack if "reserved" in s))])


def test_own_failure_and_bad_marker(session):
    proc, _ = session
    own = _section(proc.stdout, "test_fails_for_its_own_reason")
    assert "an ordinary failure" in own and "over its GPU memory budget" not in own
    # The peaks and the kept capture beside the test's own error.
    assert re.search(r"Captured allocscope call -+\non the virtual L4-24GB: peak reserved .*; capture: \S+\.alsc", own)
    bad = _section(proc.stdout, "test_unknown_gpu")
    assert "gpu_memory: unknown GPU 'NoSuchGPU'" in bad and "Traceback" not in bad


def test_passed_captures_are_removed(session):
    proc, _ = session
    kept = set(re.findall(r"capture: (\S+\.alsc)", proc.stdout))
    assert len(kept) == 3  # the failed tests' (over budget, OOM, failed for its own reason)
    assert all(os.path.exists(p) for p in kept)
