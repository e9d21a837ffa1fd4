"""DeepSpeed ZeRO-3 with a torch optimizer, unmodified for allocscope: run
under torchrun (backend nccl). ZeRO-3 checks that the ranks agree by
broadcasting rank 0's list lengths into buffers the others filled with -1.

    zero3.py OUT_DIR

Each rank writes OUT_DIR/rankN.json with torch's own peaks."""

import json
import os
import sys

import deepspeed
import torch

out_dir = sys.argv[1]
deepspeed.init_distributed("nccl")
rank = torch.distributed.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                                  torch.nn.Linear(1024, 256)) for _ in range(3)])
config = {"train_micro_batch_size_per_gpu": 32, "zero_optimization": {"stage": 3},
          "zero_allow_untested_optimizer": True}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config)
for _ in range(2):
    loss = engine(torch.randn(32, 256, device="cuda")).sum()
    engine.backward(loss)
    engine.step()
torch.cuda.synchronize()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "max_memory_reserved": torch.cuda.max_memory_reserved(),
               "max_memory_allocated": torch.cuda.max_memory_allocated()}, f)
