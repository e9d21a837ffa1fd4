"""Every way a recorded process ends leaves a complete capture whose replay
is exact, and goes as it would have gone unrecorded (issue 62), on torch's
real allocator on the virtual GPU: a time limit reached in the middle of a
backward while a DataLoader's pin-memory thread runs (the end state is
read where each device's SNAPSHOT event stands, however many events other
threads write meanwhile), SIGTERM under faulthandler's chained handler
(registered before or after recording starts, as Megatron-LM does on
import), os._exit from another thread, and a helper process that holds no
memory, killed by SIGTERM, leaves no file."""

import os
import re
import subprocess
import sys

import pytest

import allocscope
from allocscope.allocator.replay import replay

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")


def allocscope_run(tmp_path, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "allocscope", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


TRAIN = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def block(c):
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1),
                         nn.BatchNorm2d(c), nn.ReLU())


if __name__ == "__main__":
    model = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64), nn.ReLU(),
                          *[block(64) for _ in range(4)], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(64, 1000)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = TensorDataset(torch.randn(256, 3, 64, 64), torch.randint(0, 1000, (256,)))
    loader = DataLoader(data, batch_size=32, num_workers=2, pin_memory=True, shuffle=True)
    while True:
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
"""


def _stopped_at_the_limit(tmp_path, seconds, name):
    out = tmp_path / f"{name}.alsc"
    r = allocscope_run(tmp_path, "--gpu", "H100-80GB", "--max-time", str(seconds), "-f", "-o", str(out), "--",
                       sys.executable, "train.py")
    assert r.returncode == 124 and "--max-time" in r.stderr, r.stderr[-2000:]
    cap = allocscope.load(out)
    assert cap.complete and cap.footer["reason"] == "limit"
    return cap


@pytest.mark.parametrize("runs", [pytest.param(3, id="3"), pytest.param(20, id="20", marks=pytest.mark.heavy)])
def test_a_time_limit_in_the_middle_of_a_step_leaves_a_capture_that_replays_exactly(tmp_path, runs):
    (tmp_path / "train.py").write_text(TRAIN)
    late = 0
    for i in range(runs):
        cap = _stopped_at_the_limit(tmp_path, 4 + 0.13 * i, f"limit{i}")
        end = cap.baseline("end")
        assert end["snapshot_events"], end.keys()  # where the end state was read, in the stream
        fidelity = replay(cap).fidelity.to_json()
        assert fidelity["exact"], (i, fidelity["end_snapshot"], fidelity["first_mismatch"])
        late += len(cap.events) - 1 - fidelity["end_snapshot"].get("at_events", {"0": len(cap.events) - 1})["0"]
    # (not vacuous where it matters: some runs went on allocating after the end state was read)
    if runs >= 20:
        assert late > 0


FAULTHANDLER = """\
import faulthandler, os, signal, sys, time
import torch
when = sys.argv[1]
if when == "before":  # (Megatron-LM registers it on import, before CUDA starts)
    faulthandler.register(signal.SIGTERM, chain=True)
x = torch.empty(1 << 20, device="cuda")
if when == "after":
    faulthandler.register(signal.SIGTERM, chain=True)
print("allocated", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(10)
print("still alive", flush=True)
"""


@pytest.mark.parametrize("when", ["before", "after", "none"])
def test_sigterm_under_faulthandlers_chained_handler_leaves_a_complete_capture(tmp_path, when):
    (tmp_path / "ft.py").write_text(FAULTHANDLER)
    plain = allocscope_run(tmp_path, "--gpu", "L4-24GB", "--no-record", "--", sys.executable, "ft.py", when)
    recorded = allocscope_run(tmp_path, "--gpu", "L4-24GB", "-o", "ft.alsc", "--", sys.executable, "ft.py", when)
    # As unrecorded: killed by SIGTERM, faulthandler's tracebacks dumped once (where registered)
    assert plain.returncode == recorded.returncode == 128 + 15
    assert plain.stdout == recorded.stdout == "allocated\n"
    dumps = len(re.findall(r"^(Current thread|Thread) 0x", recorded.stderr, re.M))
    assert dumps == len(re.findall(r"^(Current thread|Thread) 0x", plain.stderr, re.M)) == (when != "none")
    cap = allocscope.load(tmp_path / "ft.alsc")
    assert cap.complete and cap.footer["reason"] == "SIGTERM"
    assert (cap.events.size == 4 << 20).any()


OS_EXIT = """\
import os, threading, time
import torch
ready = threading.Event()


def leave():
    ready.wait()
    time.sleep(0.5)
    os._exit(3)


threading.Thread(target=leave).start()
kept = []
while True:
    kept.append(torch.empty(1 << 16, device="cuda"))
    kept = kept[-64:]
    ready.set()
"""


def test_os_exit_from_another_thread_leaves_a_capture_that_replays_exactly(tmp_path):
    (tmp_path / "exit.py").write_text(OS_EXIT)
    r = allocscope_run(tmp_path, "--gpu", "L4-24GB", "-o", "exit.alsc", "--", sys.executable, "exit.py")
    assert r.returncode == 3, r.stderr[-2000:]
    cap = allocscope.load(tmp_path / "exit.alsc")
    assert cap.complete and cap.footer["reason"] == "os._exit"
    fidelity = replay(cap).fidelity.to_json()
    assert fidelity["exact"], fidelity


IDLE_HELPER = """\
import signal, subprocess, sys, time
import torch
if sys.argv[1:] == ["helper"]:
    torch.cuda.init()  # (an Inductor compile worker: CUDA up, no memory)
    print("up", flush=True)
    time.sleep(60)
else:
    x = torch.empty(1 << 20, device="cuda")
    helper = subprocess.Popen([sys.executable, __file__, "helper"], stdout=subprocess.PIPE, text=True)
    assert helper.stdout.readline() == "up\\n"
    helper.terminate()  # (a launcher's teardown)
    print(helper.wait())
"""


def test_a_helper_that_holds_no_memory_leaves_no_file_when_terminated(tmp_path):
    (tmp_path / "idle.py").write_text(IDLE_HELPER)
    r = allocscope_run(tmp_path, "--gpu", "L4-24GB", "-o", "run.alsc", "--", sys.executable, "idle.py")
    assert r.returncode == 0 and r.stdout.strip() == "-15", r.stderr[-2000:]
    assert allocscope.load(tmp_path / "run.alsc").complete
    assert [p for p in os.listdir(tmp_path) if p.startswith("run.pid")] == []


TEARDOWN = """\
import faulthandler, os, signal, time
import torch
import torch.distributed as dist

faulthandler.register(signal.SIGTERM, chain=True)  # (as Megatron-LM does on import)
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
kept = torch.empty(1 << 20, device="cuda")
dist.barrier()
if rank == 1:
    raise RuntimeError("rank 1 fails")  # torchrun then terminates rank 0
while True:
    time.sleep(0.05)
"""


@pytest.mark.cuda
@pytest.mark.many_gpus
def test_torchruns_teardown_leaves_every_ranks_capture_complete(tmp_path):
    (tmp_path / "teardown.py").write_text(TEARDOWN)
    r = allocscope_run(tmp_path, "--gpu", "2xL4-24GB", "-o", "job.alsc", "--", sys.executable, "-m",
                       "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "teardown.py")
    assert r.returncode != 0 and "rank 1 fails" in r.stderr, r.stderr[-3000:]
    survivor = allocscope.load(tmp_path / "job.rank0.alsc")  # terminated by torchrun's agent: SIGTERM
    assert survivor.complete and survivor.footer["reason"] == "SIGTERM", survivor.footer
    assert (survivor.events.size == 4 << 20).any()
    failed = allocscope.load(tmp_path / "job.rank1.alsc")  # (its exception ended it)
    assert failed.complete
    assert replay(survivor).fidelity.exact
