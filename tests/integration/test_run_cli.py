"""`allocscope run`: recording a whole command without touching it."""

import os
import subprocess
import sys

import numpy as np
import pytest

import allocscope
from allocscope import EventKind

from ..conftest import ROOT

SCRIPT = os.path.join(ROOT, "tests", "scripts", "train_small.py")
MARKER_LINE = 19  # `marker = torch.empty(54321, ...)` in train_small.py


def run(tmp_path, *args, output="run.alsc", timeout=300):
    out = tmp_path / output
    cmd = [sys.executable, "-m", "allocscope", "run", "--device", "cpu", "-o", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path), out


def _marker_stack(cap):
    ev = cap.events
    (i,) = np.flatnonzero((ev.kind == EventKind.ALLOC) & (ev.size == 54321))
    return cap.stack(ev.stack[i])


def test_run_records_an_unmodified_script(tmp_path):
    with open(SCRIPT) as f:
        assert f.read().splitlines()[MARKER_LINE - 1].strip().startswith("marker = torch.empty(54321")
    result, out = run(tmp_path, "--no-watch", "--", sys.executable, SCRIPT)
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout and "wrote run.alsc" in result.stderr
    cap = allocscope.load(out)
    assert cap.complete and cap.footer["reason"] == "exit"
    assert cap.metadata["argv"][0] == SCRIPT
    top = _marker_stack(cap)[0]
    assert (top.filename, top.function, top.line) == (SCRIPT, "main", MARKER_LINE)
    # Recording started when torch was imported: the model's parameters are in it.
    assert (cap.events.size == 32 * 16 * 4).any()
    # By default ops are recorded from the first watch() on: unwatched (--no-watch), nothing is.
    assert cap.metadata["ops"] == "watch" and not cap.events.op.any()


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_python_is_implied_for_a_script_and_exit_status_is_passed_on(tmp_path):
    result, out = run(tmp_path, "--no-ops", "--", SCRIPT, "exit3")
    assert result.returncode == 3
    cap = allocscope.load(out)
    assert cap.complete and cap.metadata["ops"] is False  # (and --no-ops reached the recording)


def test_an_exception_in_the_script_still_finishes_the_file(tmp_path):
    result, out = run(tmp_path, "--", SCRIPT, "raise")
    assert result.returncode == 1 and "the script failed" in result.stderr
    cap = allocscope.load(out)
    assert cap.complete and len(_marker_stack(cap)) > 0


def test_sigterm_in_the_script_finishes_the_file(tmp_path):
    result, out = run(tmp_path, "--", SCRIPT, "sigterm")
    assert result.returncode == 128 + 15
    cap = allocscope.load(out)
    assert cap.complete and cap.footer["reason"] == "SIGTERM"


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_spawned_worker_processes_write_their_own_files(tmp_path):
    result, out = run(tmp_path, "--", SCRIPT, "spawn")
    assert result.returncode == 0, result.stderr
    others = [p for p in os.listdir(tmp_path) if p.startswith("run.pid")]
    assert len(others) == 1, os.listdir(tmp_path)
    worker = allocscope.load(tmp_path / others[0])
    assert worker.complete and worker.metadata["pid"] != allocscope.load(out).metadata["pid"]
    assert (worker.events.size == 77 * 4).any()


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_a_ranks_child_process_does_not_write_into_the_ranks_file(tmp_path):
    # Inductor's compile workers and spawned data loader workers inherit the
    # rank's RANK: the rank's .rankN file is the rank's own, theirs .pidN
    result, out = run(tmp_path, "--", "env", "RANK=1", "WORLD_SIZE=2", sys.executable, SCRIPT, "spawn")
    assert result.returncode == 0, result.stderr
    assert not out.exists()
    rank = allocscope.load(tmp_path / "run.rank1.alsc")
    others = [p for p in os.listdir(tmp_path) if p.startswith("run.pid")]
    assert len(others) == 1, os.listdir(tmp_path)
    worker = allocscope.load(tmp_path / others[0])
    assert rank.complete and worker.complete and not rank.warnings
    assert (rank.events.size == 54321).any() and not (worker.events.size == 54321).any()
    assert (worker.events.size == 77 * 4).any()


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_a_worker_process_that_holds_no_memory_leaves_no_file(tmp_path):
    # Inductor's compile workers import torch (and initialize CUDA) but hold
    # no memory: one empty FILE.pidN per worker said nothing
    result, out = run(tmp_path, "--", SCRIPT, "spawn_idle")
    assert result.returncode == 0, result.stderr
    assert allocscope.load(out).complete
    assert [p for p in os.listdir(tmp_path) if p.startswith("run.pid")] == []


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_existing_output_needs_force(tmp_path):
    (tmp_path / "run.alsc").write_bytes(b"old")
    result, _ = run(tmp_path, "--", SCRIPT)
    assert result.returncode == 2 and "--force" in result.stderr
    result, out = run(tmp_path, "-f", "--", SCRIPT)
    assert result.returncode == 0 and allocscope.load(out).complete


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_a_command_that_never_uses_torch_writes_nothing(tmp_path):
    result, out = run(tmp_path, "--", sys.executable, os.path.join(ROOT, "tests", "scripts", "no_torch.py"))
    assert result.returncode == 0 and "no capture was written" in result.stderr
    assert not out.exists()


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_a_missing_command_is_a_clear_error(tmp_path):
    result, _ = run(tmp_path, "--", "/no/such/program")
    assert result.returncode == 2 and "cannot run /no/such/program" in result.stderr


def test_run_with_allocscope_watch_in_the_script(tmp_path):
    script = os.path.join(ROOT, "tests", "scripts", "train_watched.py")
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and plain.stdout.strip() == "not watched", plain.stderr
    result, out = run(tmp_path, "--", sys.executable, script)
    assert result.returncode == 0 and result.stdout.strip() == "watched", result.stderr
    from allocscope.reports import build_report

    r = build_report(allocscope.load(out), at="done")
    assert r["capture"]["watched"] == ["Sequential"]
    params = (16 * 32 + 32 + 32 * 4 + 4) * 4
    assert r["at"]["by_category"]["parameter"] == params
    assert r["at"]["by_category"]["optimizer_state"] == 2 * params + 4 * 4  # two moments, four step counters
    assert [i["iteration"] for i in r["iterations"]] == [0, 1, 2, 3]


def _virtual(tmp_path, *args):
    cmd = [sys.executable, "-m", "allocscope", "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")
def test_run_on_a_virtual_gpu_records_its_cuda_memory_the_same_every_time(tmp_path):
    runs = []
    for name in ("t4.alsc", "again.alsc"):
        result = _virtual(tmp_path, "--gpu", "T4-16GB", "-o", str(tmp_path / name), "--",
                          os.path.join(ROOT, "examples", "train.py"), "--steps", "2")
        assert result.returncode == 0, result.stderr
        runs.append(allocscope.load(tmp_path / name))
    cap = runs[0]
    assert cap.complete and cap.metadata["devices_recorded"] == ["cuda"]
    assert cap.metadata["cuda_devices"][0]["name"] == "Tesla T4"
    assert cap.metadata["virtual_gpu"]["spec"] == "T4-16GB"
    ev = cap.events
    assert (ev.kind == EventKind.SEGMENT_ALLOC).any() and (ev.kind == EventKind.ALLOC).sum() > 50
    # deterministic completion: the same requests and segment events, in the same order
    memory = [EventKind.ALLOC, EventKind.FREE, EventKind.FREE_COMPLETED, EventKind.SEGMENT_ALLOC,
              EventKind.SEGMENT_FREE]
    seqs = [[(int(k), int(s)) for k, s in zip(c.events.kind, c.events.size) if k in memory] for c in runs]
    assert seqs[0] == seqs[1]


@pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")
def test_run_without_recording_on_a_card_too_small(tmp_path):
    script = tmp_path / "big.py"
    script.write_text("import torch\nx = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\nprint('fits')\n")
    ok = _virtual(tmp_path, "--gpu", "L4-24GB", "--no-record", "--", str(script))
    assert ok.returncode == 0 and ok.stdout.strip() == "fits", ok.stderr
    assert os.listdir(tmp_path) == ["big.py"]  # nothing written
    small = _virtual(tmp_path, "--gpu", "L4-24GB", "--gpu-memory", "1GiB", "--no-record", "--", str(script))
    assert small.returncode == 1 and "OutOfMemoryError" in small.stderr
    assert "total capacity of 1024.00 MiB" in small.stderr


def test_run_records_ops_from_the_start_with_ops(tmp_path):
    """train_small.py watches nothing: by default its allocations carry no op
    (test_run_records_an_unmodified_script); --ops records them from the start."""
    result, out = run(tmp_path, "--ops", "--", sys.executable, SCRIPT)
    assert result.returncode == 0, result.stderr
    cap = allocscope.load(out)
    assert cap.metadata["ops"] is True and cap.events.op.any()


@pytest.mark.torch_agnostic  # the command line's and the harness's logic
def test_run_refuses_ops_and_no_ops_together(tmp_path):
    result, _ = run(tmp_path, "--ops", "--no-ops", "--", sys.executable, SCRIPT)
    assert result.returncode != 0 and "not allowed with" in result.stderr


UNWATCHED = """\
import json, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(2):
    model(torch.randn(8, 16)).square().mean().backward()
    opt.step()

def nbytes(tensors):
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

# live until the recording stops at exit: the parameters, their gradients, Adam's state
print(json.dumps({"parameter": nbytes(model.parameters()), "gradient": nbytes(p.grad for p in model.parameters()),
                  "optimizer_state": nbytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))}))
"""


@pytest.mark.torch_agnostic  # the flag's way to the recording; watching itself is tested on both torches
@pytest.mark.parametrize("flag", [None, "--watch"])  # (watching is the default)
def test_run_names_the_memory_of_a_script_that_never_mentions_allocscope(tmp_path, flag):
    import json

    from allocscope.attribution import attribute, moment

    (tmp_path / "train.py").write_text(UNWATCHED)
    result, out = run(tmp_path, *([flag] if flag else []), "--", sys.executable, str(tmp_path / "train.py"))
    assert result.returncode == 0, result.stderr
    expected = json.loads(result.stdout.strip().splitlines()[-1])
    cap = allocscope.load(out)
    assert [w.get("name") for w in attribute(cap).watches] == ["Sequential"]
    m = moment(attribute(cap), len(cap.events) - 1)
    for category, nbytes in expected.items():
        assert nbytes > 0 and m.by_category[category] == nbytes, category
    assert {"Sequential.0", "Sequential.2"} <= set(m.by_module)  # the layers own their parameters' bytes
    assert cap.metadata["ops"] == "watch" and cap.events.op.any()  # ops from the watch on
    # what is not named is under 1% of the peak
    from allocscope.reports import build_report

    peak = build_report(cap)["peak"]
    assert peak["by_category"]["other"] <= 0.01 * peak["allocated_bytes"], peak["by_category"]


@pytest.mark.torch_agnostic
def test_run_no_watch_records_stacks_alone(tmp_path):
    from allocscope.attribution import attribute

    (tmp_path / "train.py").write_text(UNWATCHED)
    result, out = run(tmp_path, "--no-watch", "--", sys.executable, str(tmp_path / "train.py"))
    assert result.returncode == 0, result.stderr
    cap = allocscope.load(out)
    assert attribute(cap).watches == [] and cap.metadata["ops"] == "watch" and not cap.events.op.any()


@pytest.mark.torch_agnostic
def test_run_refuses_recording_options_without_a_recording(tmp_path, capsys):
    from allocscope.cli import main

    for flag in ("--watch", "--no-watch", "--ops", "--no-ops"):
        assert main(["run", "--gpu", "H100-80GB", "--no-record", flag, "--", sys.executable, "-c", "pass"]) == 2, flag
        assert "not with --no-record" in capsys.readouterr().err
