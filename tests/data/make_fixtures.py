"""Makes the small real captures in tests/data (run from the repository root):

    python tests/data/make_fixtures.py

cpu_train_v1.alsc: two Adam steps of a small CNN on the CPU, recorded with
Python stacks, format version 1. cuda_train_v1.alsc (only where a GPU is
available): the same on CUDA, so that CPU-only CI checks the analyses on real
CUDA allocator data (tests/unit/test_cuda_fixtures.py). Tests read it as real data (the reader's
fuzz test mutates it); keep it when the format version changes, so that the
reader is shown to keep reading version 1.

cpu_watch_v1.alsc and cuda_watch_v1.alsc (GPU only): the same training with
the model and optimizer watched (allocscope.watch), a mark after each forward
and each step, for the attribution tests (tests/unit/test_watch_fixtures.py).

With --allocator (GPU only): the caching-allocator workloads of
tests/scripts/allocator_workloads.py, for the replay tests
(tests/unit/test_allocator_fixtures.py): cuda_fragment_v1.alsc (growing
sequence lengths, default settings), cuda_fragment_expandable_v1.alsc (the
same with expandable_segments:True) and cuda_oom_v1.alsc (runs out of memory
under a memory fraction).
"""

import os

import torch
from torch import nn

import allocscope

HERE = os.path.dirname(os.path.abspath(__file__))


def train(path: str, device: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters())
    with allocscope.record(path, device=device):
        for step in range(2):
            loss = model(torch.randn(2, 3, 8, 8, device=device)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            allocscope.mark(f"step {step}")


def train_watched(path: str, device: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters())
    with allocscope.record(path, device=device) as rec:
        rec.watch(model, opt)
        for step in range(3):
            out = model(torch.randn(4, 3, 16, 16, device=device))
            loss = nn.functional.cross_entropy(out, torch.arange(4, device=device))
            allocscope.mark(f"forward {step}")
            loss.backward()
            opt.step()
            allocscope.mark(f"step {step}")
            opt.zero_grad()


def allocator_fixtures() -> None:
    import subprocess
    import sys

    script = os.path.join(HERE, "..", "scripts", "allocator_workloads.py")
    runs = [("fragment", "cuda_fragment_v1.alsc", ""), ("fragment", "cuda_fragment_expandable_v1.alsc",
                                                           "expandable_segments:True"), ("oom", "cuda_oom_v1.alsc", "")]
    for workload, name, conf in runs:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        subprocess.run([sys.executable, script, workload, os.path.join(HERE, name)], env=env, check=True)


if __name__ == "__main__":
    import sys

    if "--allocator" in sys.argv:
        if torch.cuda.is_available():
            allocator_fixtures()
        sys.exit(0)

    only_watched = "--watched" in sys.argv  # keep the version-1 fixtures the reader tests pin
    if not only_watched:
        train(os.path.join(HERE, "cpu_train_v1.alsc"), "cpu")
    train_watched(os.path.join(HERE, "cpu_watch_v1.alsc"), "cpu")
    if torch.cuda.is_available():
        if not only_watched:
            train(os.path.join(HERE, "cuda_train_v1.alsc"), "cuda")
        train_watched(os.path.join(HERE, "cuda_watch_v1.alsc"), "cuda")
