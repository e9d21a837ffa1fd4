"""torch.compile's modes on one small model: 3 Adam steps of a 3-block MLP
(Linear 256->1024, GELU, Linear 1024->256) with a 10-way head, batch 512, compiled with the
default backend in MODE (default, reduce-overhead, max-autotune); prints
torch's peaks as JSON. Run it on the virtual GPU:

    allocscope run --gpu H100-80GB --no-record -- python benchmarks/compile_modes.py max-autotune
"""

import json
import sys
import time

import torch
from torch import nn


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "default"
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                            for _ in range(3)), nn.Linear(256, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
    started = time.perf_counter()
    for _ in range(3):
        compiled(torch.randn(512, 256, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    print(json.dumps({"mode": mode, "max_memory_reserved": torch.cuda.max_memory_reserved(),
                      "max_memory_allocated": torch.cuda.max_memory_allocated(),
                      "seconds": round(time.perf_counter() - started, 2)}))


if __name__ == "__main__":
    main()
