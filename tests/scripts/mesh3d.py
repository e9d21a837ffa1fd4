"""A Llama-shaped model on a 3-D DeviceMesh, as torchtitan builds it:
pipeline parallel (1F1B over "pp") x FSDP2 (over "dp") x tensor parallel with
sequence parallel (over "tp"), unmodified for allocscope: run under
torchrun (backend nccl).

    mesh3d.py OUT_DIR PP DP TP [SIZE]

SIZE: tiny (the default: 4 layers of 256, for the tests) or llama3-8b (32
layers of 4096, SwiGLU 14336, 32 heads, 8 KV heads, vocabulary 128256,
sequence 8192, a micro-batch of 1 sequence as torchtitan's Llama 3 8B
configuration; for benchmarks/bench_many_gpus.py). Stage k holds layers
k * L / PP to (k + 1) * L / PP - 1, the first the embedding, the last the
norm and the output. Each rank writes OUT_DIR/rankN.json with torch's own
peaks."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

SIZES = {"tiny": dict(layers=4, dim=256, ffn=768, heads=8, kv_heads=4, vocab=1024, seq=256, batch=8),
         "llama3-8b": dict(layers=32, dim=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq=8192, batch=1)}
out_dir, pp, dp, tp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
size = SIZES[sys.argv[5] if len(sys.argv) > 5 else "tiny"]
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
mesh = init_device_mesh("cuda", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
stage_index = mesh.get_local_rank("pp")
torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.head_dim = c["dim"] // c["heads"]
        self.wq = nn.Linear(c["dim"], c["heads"] * self.head_dim, bias=False)
        self.wk = nn.Linear(c["dim"], c["kv_heads"] * self.head_dim, bias=False)
        self.wv = nn.Linear(c["dim"], c["kv_heads"] * self.head_dim, bias=False)
        self.wo = nn.Linear(c["heads"] * self.head_dim, c["dim"], bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # (tensor parallel: this rank's heads, the projections' local outputs)
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Linear(c["dim"], c["ffn"], bias=False)
        self.w2 = nn.Linear(c["ffn"], c["dim"], bias=False)
        self.w3 = nn.Linear(c["dim"], c["ffn"], bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(c["dim"]), Attention(c)
        self.ffn_norm, self.feed_forward = nn.RMSNorm(c["dim"]), FeedForward(c)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Stage(nn.Module):
    """The layers of one pipeline stage; the first holds the embedding, the last the norm and the output."""

    def __init__(self, c, index, stages):
        super().__init__()
        per = c["layers"] // stages
        self.first, self.last = index == 0, index == stages - 1
        self.tok_embeddings = nn.Embedding(c["vocab"], c["dim"]) if self.first else None
        self.layers = nn.ModuleDict({str(i): Block(c) for i in range(index * per, (index + 1) * per)})
        self.norm = nn.RMSNorm(c["dim"]) if self.last else None
        self.output = nn.Linear(c["dim"], c["vocab"], bias=False) if self.last else None

    def forward(self, x):
        h = self.tok_embeddings(x) if self.first else x
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h)) if self.last else h


def tensor_parallel(stage, tp_mesh):
    """torchtitan's plan: sequence parallel norms, colwise/rowwise projections, the sequence sharded between."""
    if stage.first:
        parallelize_module(stage, tp_mesh, {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(),
                                                                              output_layouts=Shard(1))})
    if stage.last:
        parallelize_module(stage, tp_mesh, {"norm": SequenceParallel(),
                                            "output": ColwiseParallel(input_layouts=Shard(1),
                                                                      output_layouts=Replicate())})
    for block in stage.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })


with torch.device("cuda"):
    stage_module = Stage(size, stage_index, pp)
if tp > 1:
    tensor_parallel(stage_module, mesh["tp"])
for block in stage_module.layers.values():
    fully_shard(block, mesh=mesh["dp"])
fully_shard(stage_module, mesh=mesh["dp"])
microbatches = 4
stage = PipelineStage(stage_module, stage_index, pp, torch.device("cuda"), group=mesh.get_group("pp"))
schedule = Schedule1F1B(stage, n_microbatches=microbatches,
                        loss_fn=lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten(0, 1)))
optimizer = torch.optim.AdamW(stage_module.parameters())
tokens = torch.randint(0, size["vocab"], (size["batch"] * microbatches, size["seq"]), device="cuda")
for _ in range(2):
    args = (tokens,) if stage_index == 0 else ()
    kwargs = {"target": tokens, "losses": []} if stage_index == pp - 1 else {}
    schedule.step(*args, **kwargs)
    optimizer.step()
    optimizer.zero_grad()
torch.cuda.synchronize()
with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"rank": dist.get_rank(), "stage": stage_index, "max_memory_reserved": torch.cuda.max_memory_reserved(),
               "max_memory_allocated": torch.cuda.max_memory_allocated(),
               # the stage's parameters, whole (a DTensor counts its global shape)
               "stage_parameters": sum(p.numel() for p in stage_module.parameters())}, f)
dist.destroy_process_group()
