"""Makes the small real captures in tests/data (run from the repository root):

    python tests/data/make_fixtures.py                  # CUDA on a GPU if there is one, else the virtual H100
    python tests/data/make_fixtures.py --gpu A100-40GB  # CUDA on that virtual GPU, even where a GPU exists
    python tests/data/make_fixtures.py --out DIR        # somewhere else (make gpu-check)

cpu_train_v1.alsc: two Adam steps of a small CNN on the CPU, recorded with
Python stacks, format version 1. cuda_train_v1.alsc: the same on CUDA, so
that CPU-only CI checks the analyses on real CUDA allocator data
(tests/unit/test_cuda_fixtures.py). Tests read them as real data (the
reader's fuzz test mutates them); keep them when the format version changes,
so that the reader is shown to keep reading version 1.

cpu_watch_vN.alsc and cuda_watch_vN.alsc: the same training with the model
and optimizer watched (allocscope.watch), a mark after each forward and each
step, for the attribution tests (tests/unit/test_watch_fixtures.py), one pair
per format version (N: the version that made them; version 2 records ops).

The caching-allocator workloads of tests/scripts/allocator_workloads.py, for
the replay tests (tests/unit/test_allocator_fixtures.py):
cuda_fragment_v1.alsc (growing sequence lengths, default settings),
cuda_fragment_expandable_v1.alsc (the same with expandable_segments:True) and
cuda_oom_v1.alsc (runs out of memory under a memory fraction).

The CUDA captures come from torch's real caching allocator either way; their
metadata says whether the device was virtual (virtual_gpu) and which.
--watched remakes only the watched fixtures, --cuda only the CUDA ones.
"""

import os
import sys

import torch
from torch import nn

import allocscope
from allocscope.capture.format import FORMAT_VERSION

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from tests.support.environment import with_alloc_conf  # noqa: E402


def train(path: str, device: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters())
    with allocscope.record(path, device=device, ops=True):
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
    with allocscope.record(path, device=device, ops=True) as rec:
        rec.watch(model, opt)
        for step in range(3):
            out = model(torch.randn(4, 3, 16, 16, device=device))
            loss = nn.functional.cross_entropy(out, torch.arange(4, device=device))
            allocscope.mark(f"forward {step}")
            loss.backward()
            opt.step()
            allocscope.mark(f"step {step}")
            opt.zero_grad()


def allocator_fixtures(out: str, env: dict[str, str]) -> None:
    import subprocess
    import sys

    script = os.path.join(HERE, "..", "scripts", "allocator_workloads.py")
    runs = [("fragment", "cuda_fragment_v1.alsc", ""), ("fragment", "cuda_fragment_expandable_v1.alsc",
                                                           "expandable_segments:True"), ("oom", "cuda_oom_v1.alsc", "")]
    for workload, name, conf in runs:
        subprocess.run([sys.executable, script, workload, os.path.join(out, name)], env=with_alloc_conf(conf, env),
                       check=True, stdout=subprocess.DEVNULL)


def cuda_fixtures(out: str, only_watched: bool) -> None:
    """In this process, on the CUDA device it has (real or virtual)."""
    if not only_watched:
        train(os.path.join(out, "cuda_train_v1.alsc"), "cuda")
    train_watched(os.path.join(out, f"cuda_watch_v{FORMAT_VERSION}.alsc"), "cuda")


def main() -> None:
    import argparse
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=HERE, help="where to write them (default: tests/data)")
    parser.add_argument("--gpu", help="record the CUDA ones on this virtual GPU (default: a GPU if there is one, "
                                      "else H100-80GB)")
    parser.add_argument("--watched", action="store_true", help="only the watched fixtures")
    parser.add_argument("--cuda", action="store_true", help="only the CUDA fixtures")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # the CUDA child
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.in_process:
        cuda_fixtures(args.out, args.watched)
        return
    if not args.cuda:
        if not args.watched:  # keep the version-1 fixtures the reader tests pin
            train(os.path.join(args.out, "cpu_train_v1.alsc"), "cpu")
        train_watched(os.path.join(args.out, f"cpu_watch_v{FORMAT_VERSION}.alsc"), "cpu")
    env = dict(os.environ)
    if args.gpu or not torch.cuda.is_available():
        env = allocscope.vgpu.environment(args.gpu or "H100-80GB")
    child = [sys.executable, __file__, "--in-process", "--out", args.out] + (["--watched"] if args.watched else [])
    subprocess.run(child, env=env, check=True)
    if not args.watched:
        allocator_fixtures(args.out, env)


if __name__ == "__main__":
    main()
