"""Context parallelism (torch.distributed.tensor.experimental.context_parallel),
unmodified for allocscope: run under torchrun (backend nccl). An attention
layer's input of 4096 tokens is sharded along the sequence over the world;
inside the context, scaled_dot_product_attention runs as ring attention
(causal, load-balanced shards). One forward and backward in bf16.

    context_parallel.py OUT_DIR

Each rank writes OUT_DIR/rankN.json with torch's own peaks."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

out_dir = sys.argv[1]
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
torch.manual_seed(0)
batch, heads, sequence, head_dim = 2, 8, 4096, 64
qkv = torch.nn.Linear(heads * head_dim, 3 * heads * head_dim).cuda().to(torch.bfloat16)
x = torch.randn(batch, sequence, heads * head_dim, device="cuda", dtype=torch.bfloat16)
with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
    local_sequence = x.shape[1]
    q, k, v = (t.view(batch, -1, heads, head_dim).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
torch.cuda.synchronize()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "local_sequence": local_sequence, "max_memory_reserved": torch.cuda.max_memory_reserved(),
               "max_memory_allocated": torch.cuda.max_memory_allocated()}, f)
dist.destroy_process_group()
