"""A pipeline with torch.distributed.pipelining, unmodified for allocscope:
run under torchrun. Backend nccl.

    pipeline.py SCHEDULE OUT_DIR [PP]

SCHEDULE: gpipe, 1f1b (one stage per rank); interleaved1f1b, loopedbfs,
interleavedzb (two stages per rank, looped: rank r holds stages r and
r + world); zbv, dualpipev (two per rank, in a V: r and 2 world - 1 - r).
PP: the pipeline's ranks, of a DeviceMesh ("pp", "dp") of PP x world / PP
(pipeline parallel x data parallel, as torchtitan orders them: ranks
k * world / PP to (k + 1) * world / PP - 1 hold stage k); the data-parallel
replicas exchange nothing. Without it, every rank is a stage.
Stage 0 is four times as wide as the others. Each rank writes
OUT_DIR/rankN.json with torch's own peaks and the shapes its stages received
(the metadata stages exchange with send_object_list/recv_object_list)."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
from torch.distributed.pipelining import PipelineStage

SINGLE = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
LOOPED = {"interleaved1f1b": "ScheduleInterleaved1F1B", "loopedbfs": "ScheduleLoopedBFS",
          "interleavedzb": "ScheduleInterleavedZeroBubble"}
V_SHAPED = {"zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}

schedule, out_dir = sys.argv[1], sys.argv[2]
dist.init_process_group("nccl")
global_rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
device = torch.device("cuda")
torch.manual_seed(0)
group = None
rank, world = global_rank, dist.get_world_size()
if len(sys.argv) > 3:
    from torch.distributed.device_mesh import init_device_mesh

    pp = int(sys.argv[3])
    mesh = init_device_mesh("cuda", (pp, world // pp), mesh_dim_names=("pp", "dp"))
    group, rank, world = mesh.get_group("pp"), mesh.get_local_rank("pp"), pp
if schedule in SINGLE:
    stage_ids = [rank]
elif schedule in LOOPED:
    stage_ids = [rank, rank + world]
else:
    stage_ids = [rank, 2 * world - 1 - rank]
n_stages = world * len(stage_ids)


def block(stage_id):
    hidden = 8192 if stage_id == 0 else 2048
    return torch.nn.Sequential(torch.nn.Linear(1024, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1024)).to(device)


modules = [block(s) for s in stage_ids]
stages = [PipelineStage(m, s, n_stages, device, group=group) for m, s in zip(modules, stage_ids)]
microbatches, rows = 4, 256
cls = getattr(pipelining, {**SINGLE, **LOOPED, **V_SHAPED}[schedule])
# (every rank passes the loss, as torch's docs do: a schedule without one runs no backward)
runner = cls(stages[0] if schedule in SINGLE else stages, n_microbatches=microbatches,
             loss_fn=lambda out, target: torch.nn.functional.mse_loss(out, target))
optimizer = torch.optim.AdamW([p for m in modules for p in m.parameters()])
first, last = 0 in stage_ids, n_stages - 1 in stage_ids
x = torch.randn(microbatches * rows, 1024, device=device) if first else None
y = torch.randn(microbatches * rows, 1024, device=device) if last else None
for _ in range(2):
    args = (x,) if first else ()
    kwargs = {"target": y, "losses": []} if last else {}
    runner.step(*args, **kwargs)
    optimizer.step()
    optimizer.zero_grad()
received = [list(info.buffer.shape) for stage in stages for info in stage.args_recv_info.get(0, ())
            if getattr(info, "buffer", None) is not None]
with open(os.path.join(out_dir, f"rank{global_rank}.json"), "w") as f:
    json.dump({"rank": global_rank, "stages": stage_ids, "max_memory_reserved": torch.cuda.max_memory_reserved(),
               "max_memory_allocated": torch.cuda.max_memory_allocated(), "received": received,
               "optimizer_states": len(optimizer.state)}, f)
dist.destroy_process_group()
