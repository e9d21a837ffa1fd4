"""A two-stage (or N-stage) pipeline with torch.distributed.pipelining, one
stage per rank, unmodified for allocscope: run under torchrun. Backend nccl.

    pipeline.py SCHEDULE OUT_DIR      (SCHEDULE: gpipe, 1f1b)

Stage 0 is four times as wide as the others. Each rank writes
OUT_DIR/rankN.json with torch's own peaks and the shapes its stage received
(the metadata the stages exchange with send_object_list/recv_object_list)."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

schedule, out_dir = sys.argv[1], sys.argv[2]
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
device = torch.device("cuda")
torch.manual_seed(0)
hidden = 8192 if rank == 0 else 2048
module = torch.nn.Sequential(torch.nn.Linear(1024, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1024)).to(device)
microbatches, rows = 4, 256
stage = PipelineStage(module, rank, world, device)
last = rank == world - 1
# (every rank passes the loss, as torch's docs do: a schedule without one runs no backward)
runner = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule](
    stage, n_microbatches=microbatches, loss_fn=lambda out, target: torch.nn.functional.mse_loss(out, target))
optimizer = torch.optim.AdamW(module.parameters())
x = torch.randn(microbatches * rows, 1024, device=device) if rank == 0 else None
y = torch.randn(microbatches * rows, 1024, device=device) if last else None
for _ in range(2):
    if rank == 0:
        runner.step(x)
    elif last:
        runner.step(target=y, losses=[])
    else:
        runner.step()
    optimizer.step()
    optimizer.zero_grad()
received = [list(info.buffer.shape) for info in stage.args_recv_info[0] if getattr(info, "buffer", None) is not None]
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "max_memory_reserved": torch.cuda.max_memory_reserved(),
               "max_memory_allocated": torch.cuda.max_memory_allocated(), "received": received,
               "optimizer_states": len(optimizer.state)}, f)
dist.destroy_process_group()
