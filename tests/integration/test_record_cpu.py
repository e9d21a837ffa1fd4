"""Recording real CPU training loops, end to end."""

import inspect

import numpy as np
import pytest
import torch
from torch import nn

import allocscope
from allocscope import EventKind
from allocscope.attribution.lifetimes import lifetimes

from ..conftest import run_python


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def test_training_loop_capture_accounts_for_every_byte(tmp_path):
    torch.manual_seed(0)
    model = ConvNet()  # built before recording starts
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "train.alsc"
    with allocscope.record(path, device="cpu") as rec:
        for step in range(3):
            x = torch.randn(4, 3, 16, 16)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated
            allocscope.mark(f"step {step}")
        del x, loss
        marker_line = inspect.currentframe().f_lineno + 1
        kept = torch.empty(123457, dtype=torch.uint8)
    assert rec.summary["events"] > 0 and rec.summary["dropped"] == 0

    cap = allocscope.load(path)
    ev = cap.events
    assert cap.complete and cap.footer["reason"] == "stopped"
    assert cap.metadata["devices_recorded"] == ["cpu"] and cap.metadata["stacks"] == "python"
    assert ev.seq.tolist() == list(range(len(ev)))

    # Every free matches an earlier allocation (the CPU has no baseline blocks).
    lt = lifetimes(ev)
    assert len(lt.unmatched_frees) == 0 and len(lt.double_allocs) == 0

    # What is live at the end is exactly the storage of the tensors still
    # alive that were allocated while recording: gradients, Adam's state, kept.
    alive = [p.grad for p in model.parameters()]
    alive += [v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]
    alive.append(kept)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in alive}
    live = lt.live_at_end
    assert sorted(ev.addr[live].tolist()) == sorted(storages)
    assert int(ev.size[live].sum()) == sum(storages.values())

    # The allocation on the marked line has that line on top of its stack.
    (i,) = np.flatnonzero((ev.kind == EventKind.ALLOC) & (ev.size == 123457))
    top = cap.stack(ev.stack[i])[0]
    assert (top.filename, top.function, top.line) == (__file__, "test_training_loop_capture_accounts_for_every_byte",
                                                      marker_line)
    # Allocations inside the model name the module's forward.
    functions = {f.function for j in np.flatnonzero(ev.kind == EventKind.ALLOC) for f in cap.stack(ev.stack[j])}
    assert {"ConvNet.forward", "_BatchNorm.forward", "Adam.step"} <= functions

    marks = np.flatnonzero(ev.kind == EventKind.MARK)
    assert [cap.label(j) for j in marks] == ["step 0", "step 1", "step 2"]
    assert cap.stack(ev.stack[marks[0]])[1].function == "test_training_loop_capture_accounts_for_every_byte"


def test_stacks_none_records_no_stacks(tmp_path):
    with allocscope.record(tmp_path / "n.alsc", device="cpu", stacks="none"):
        torch.ones(1000) * 2
    cap = allocscope.load(tmp_path / "n.alsc")
    assert len(cap.events) >= 2 and not cap.events.stack.any()
    assert cap.metadata["recorder"]["stack_walker"] == "none"


def test_exception_in_block_leaves_a_complete_file(tmp_path):
    with pytest.raises(ValueError, match="boom"):
        with allocscope.record(tmp_path / "e.alsc", device="cpu"):
            torch.zeros(100)
            raise ValueError("boom")
    cap = allocscope.load(tmp_path / "e.alsc")
    assert cap.complete and cap.footer["reason"] == "exception: ValueError"
    assert cap.events.counts()["alloc"] >= 1


def test_decorator_records_each_call(tmp_path):
    path = tmp_path / "d.alsc"

    @allocscope.record(path, device="cpu")
    def work(n):
        return torch.empty(n).sum()

    work(1001)
    assert (allocscope.load(path).events.size == 1001 * 4).sum() == 1
    work(2002)
    sizes = allocscope.load(path).events.size
    assert (sizes == 2002 * 4).sum() == 1 and (sizes == 1001 * 4).sum() == 0


def test_one_recording_at_a_time_and_clear_argument_errors(tmp_path):
    with allocscope.record(tmp_path / "a.alsc", device="cpu") as rec:
        with pytest.raises(allocscope.AllocscopeError, match="already recording to .*a.alsc"):
            allocscope.record(tmp_path / "b.alsc", device="cpu").__enter__()
        assert rec.active
    assert not rec.active
    with pytest.raises(ValueError, match="device must be"):
        allocscope.record(tmp_path / "c.alsc", device="tpu")
    with pytest.raises(ValueError, match="stacks must be"):
        allocscope.record(tmp_path / "c.alsc", stacks="all")
    with pytest.raises(TypeError, match="path must be"):
        allocscope.record(42)
    with pytest.raises(allocscope.AllocscopeError, match="cannot open"):
        allocscope.record(tmp_path / "no" / "such" / "dir.alsc", device="cpu").__enter__()
    assert allocscope.mark("nobody listens") is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_cuda_recording_without_cuda_is_a_clear_error(tmp_path):
    with pytest.raises(allocscope.AllocscopeError, match="CUDA is not available|built without CUDA support"):
        with allocscope.record(tmp_path / "c.alsc", device="cuda"):
            pass


def test_many_events_stream_through_the_bounded_buffer(tmp_path):
    # Far more events than the ring holds (65536): the writer must keep up or
    # hold producers back, never drop.
    n = 150_000
    with allocscope.record(tmp_path / "big.alsc", device="cpu", stacks="none") as rec:
        for _ in range(n):
            torch.empty(10)
    cap = allocscope.load(tmp_path / "big.alsc")
    assert rec.summary["dropped"] == 0
    counts = cap.events.counts()
    assert counts["alloc"] >= n and counts["alloc"] == counts["free"]
    assert cap.events.seq.tolist() == list(range(len(cap.events)))
    # Compact: the issue asks for at most 16 bytes per event on disk.
    assert rec.summary["bytes"] / len(cap.events) < 16


def test_import_does_nothing_and_reading_needs_no_torch(tmp_path):
    from allocscope.capture.writer import CaptureWriter

    path = CaptureWriter().write(tmp_path / "s.alsc")
    code = (
        "import sys; sys.modules['torch'] = None\n"  # importing torch would fail
        "import allocscope\n"
        f"cap = allocscope.load({str(path)!r})\n"
        "print(cap.complete, 'allocscope._C' in sys.modules)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]


def test_recording_survives_sigkill_as_a_readable_prefix(tmp_path):
    path = tmp_path / "killed.alsc"
    code = (
        "import os, signal, time, torch, allocscope\n"
        f"rec = allocscope.record({str(path)!r}, device='cpu').__enter__()\n"
        "for i in range(20000):\n"
        "    torch.empty(i % 100 + 1)\n"
        "time.sleep(0.3)\n"  # the writer flushes at least every 20 ms
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = run_python(code)
    assert result.returncode == -9
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", allocscope.TruncatedCaptureWarning)
        cap = allocscope.load(path)
    assert not cap.complete
    assert cap.events.counts()["alloc"] >= 20000
    assert cap.metadata["pid"] > 0


def test_sigterm_finishes_the_file_then_terminates(tmp_path):
    path = tmp_path / "term.alsc"
    code = (
        "import os, signal, time, torch, allocscope\n"
        f"rec = allocscope.record({str(path)!r}, device='cpu').__enter__()\n"
        "torch.empty(4242)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
        "print('not reached')\n"
    )
    result = run_python(code)
    assert result.returncode == -15 and "not reached" not in result.stdout
    cap = allocscope.load(path)
    assert cap.complete and cap.footer["reason"] == "SIGTERM"
    assert (cap.events.size == 4242 * 4).sum() == 1


def test_a_user_sigterm_handler_is_left_alone(tmp_path):
    code = (
        "import os, signal, torch, allocscope\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('handled'))\n"
        f"with allocscope.record({str(tmp_path / 'h.alsc')!r}, device='cpu'):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    torch.empty(10)\n"
        "print('continued')\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["handled", "continued"]


def test_forked_child_does_not_record_or_hang(tmp_path):
    path = tmp_path / "fork.alsc"
    code = (
        "import os, torch, allocscope\n"
        f"with allocscope.record({str(path)!r}, device='cpu'):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        for i in range(200000):\n"  # more than the ring holds: would hang if recorded
        "            torch.empty(8)\n"
        "        os._exit(0)\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    torch.empty(31337)\n"
        "print(status)\n"
    )
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
    ev = allocscope.load(path).events
    assert (ev.size == 31337 * 4).sum() == 1
    assert (ev.size == 8 * 4).sum() == 0


def test_forked_child_still_dies_on_sigterm_and_exits_normally(tmp_path):
    code = (
        "import os, signal, sys, time, torch, allocscope\n"
        f"rec = allocscope.record({str(tmp_path / 'f.alsc')!r}, device='cpu').__enter__()\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(w, b'x')\n"
        "    time.sleep(60)\n"  # the parent's SIGTERM must end this
        "    os._exit(5)\n"
        "os.read(r, 1)\n"
        "os.kill(pid, signal.SIGTERM)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child1', os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    assert allocscope.mark('child') is False\n"
        "    try:\n"
        f"        allocscope.record({str(tmp_path / 'child.alsc')!r}, device='cpu').__enter__()\n"
        "    except allocscope.AllocscopeError as e:\n"
        "        assert 'forked while its parent was recording' in str(e)\n"
        "    else:\n"
        "        sys.exit(7)\n"
        "    torch.empty(10)\n"
        "    sys.exit(0)\n"  # runs the inherited atexit handlers
        "_, status = os.waitpid(pid, 0)\n"
        "print('child2', os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)\n"
    )
    result = run_python(code, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["child1", "True", "child2", "True"], result.stderr
    assert allocscope.load(tmp_path / "f.alsc").complete
