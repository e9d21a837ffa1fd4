"""Workloads that run out of memory on a (virtual) GPU, for the OOM
post-mortem's claims to be checked by running them again under the settings
it suggests (tests/integration/test_oom_postmortem_cuda.py):

    [PYTORCH_CUDA_ALLOC_CONF=...] python tests/scripts/oom_workloads.py NAME [OUT.alsc]

Each is a fixed sequence of requests under a 1 GiB memory fraction that
stops at the first out-of-memory error, so that a run under other settings
makes the same requests up to that point.

batch: a watched MLP trained with a batch too large for the budget.
fragments: 6 MiB tensors fill 48 segments of 20 MiB; two of every three are
    freed (672 MiB cached, in 12 MiB holes of segments still in use), then
    an 80 MiB request needs a new segment that the fraction no longer allows.
pending: a 600 MiB tensor used on a busy side stream (record_stream) is
    freed, and another 600 MiB is asked for while that free still waits for
    the side stream.

With OUT it records to OUT; the last line printed is JSON: {"oom": the run
ran out of memory, "max_reserved": torch's peak reserved bytes}.
"""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.support.measured_run import measured_run  # noqa: E402

MiB = 1 << 20
BUDGET = 1 << 30


def batch(rec) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                          nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters())
    if rec is not None:
        rec.watch(model, opt)
    for _ in range(2):
        x = torch.randn(32768, 1024, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def fragments(rec) -> None:
    held = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(3 * 48)]
    for i in range(len(held)):
        if i % 3 != 2:
            held[i] = None
    big = torch.empty(80 * MiB, dtype=torch.uint8, device="cuda")
    del big, held


def pending(rec) -> None:
    side = torch.cuda.Stream()
    x = torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(1e9))  # keeps the side stream busy
        x.add_(1)
    x.record_stream(side)
    del x  # its block waits for the side stream
    y = torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
    del y


WORKLOADS = {"batch": batch, "fragments": fragments, "pending": pending}


def main() -> None:
    work = WORKLOADS[sys.argv[1]]
    torch.cuda.init()
    torch.cuda.set_per_process_memory_fraction(BUDGET / torch.cuda.get_device_properties(0).total_memory)
    measured_run(work, sys.argv[2] if len(sys.argv) > 2 else None)


if __name__ == "__main__":
    main()
