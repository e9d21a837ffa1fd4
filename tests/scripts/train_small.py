"""Recorded by tests through `allocscope run`; never imports allocscope."""

import os
import signal
import sys

import torch
from torch import nn


def main(mode: str) -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        loss = model(torch.randn(8, 16)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    marker = torch.empty(54321, dtype=torch.uint8)  # tests look for this line
    if mode == "raise":
        raise RuntimeError("the script failed")
    if mode == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    if mode == "exit3":
        sys.exit(3)
    if mode in ("spawn", "spawn_idle"):
        import multiprocessing as mp

        # spawn_idle: a helper that imports torch and holds no memory
        target, args = (torch.ones, (77,)) if mode == "spawn" else (torch.get_num_threads, ())
        p = mp.get_context("spawn").Process(target=target, args=args)
        p.start()
        p.join()
    print("done", marker.numel())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ok")
