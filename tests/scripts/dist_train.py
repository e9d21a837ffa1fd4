"""A small distributed training script, unmodified for allocscope: run under
torchrun, or as one rank alone (allocscope run --world-size). Backend nccl.

    dist_train.py MODE[,MODE...] OUT_DIR

Modes run one after the other in the process. MODE: ddp, fsdp1, fsdp2, hsdp (FSDP2 on a 2 x N/2 mesh: replicate x shard),
tp (colwise/rowwise MLP over the whole world), tpsp (a block of LayerNorm and
MLP: sequence parallel norm, colwise/rowwise MLP, the sequence sharded between
them), fsdp2tp (that block, tensor parallel on a 2-D mesh's "tp" dimension of
2, FSDP2 on its "dp" dimension of world / 2), noset (each
rank allocates before torch.cuda.set_device: its context lands on cuda:0),
objects (the object collectives). Each rank writes OUT_DIR/rankN.json with
torch's own peaks, per mode and of the whole process, and what the object
collectives returned."""

import gc
import json
import os
import sys

import torch
import torch.distributed as dist

modes, out_dir = sys.argv[1].split(","), sys.argv[2]
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ.get("LOCAL_RANK", "0"))
if "noset" in modes:
    probe = torch.zeros(1, device="cuda")  # before set_device: on cuda:0
torch.cuda.set_device(local)
torch.manual_seed(0)
result = {"rank": rank, "world_size": world, "peaks": {}}


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))


class Block(torch.nn.Module):
    """A transformer's MLP half: LayerNorm, then an MLP, on (batch, sequence, 256)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(256)
        self.up = torch.nn.Linear(256, 1024)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(1024, 256)

    def forward(self, x):
        return self.down(self.act(self.up(self.norm(x))))


def sequence_parallel(block, mesh):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    # the sequence sharded through the norm, gathered into the MLP, reduce-scattered out of it
    return parallelize_module(block, mesh, {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                                            "down": RowwiseParallel(output_layouts=Shard(1))})


def build(mode):
    if mode in ("ddp", "noset", "objects"):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(mlp().cuda(), device_ids=[local])
    if mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(torch.nn.Sequential(*[mlp() for _ in range(3)]).cuda(), device_id=local)
    if mode in ("fsdp2", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = None
        if mode == "hsdp":
            mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        model = torch.nn.Sequential(*[mlp() for _ in range(3)]).cuda()
        for layer in model:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cuda", (world,))
        return parallelize_module(mlp().cuda(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if mode == "tpsp":
        from torch.distributed.device_mesh import init_device_mesh

        return sequence_parallel(Block().cuda(), init_device_mesh("cuda", (world,)))
    if mode == "fsdp2tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cuda", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        return fully_shard(sequence_parallel(Block().cuda(), mesh["tp"]), mesh=mesh["dp"])
    raise SystemExit(f"unknown mode {mode}")


def batch(mode):
    """A step's input: this rank's shard of a sequence of 512 where the sequence is sharded."""
    if mode == "tpsp":
        return torch.randn(8, 512 // world, 256, device="cuda")
    if mode == "fsdp2tp":
        return torch.randn(8, 512 // 2, 256, device="cuda")
    return torch.randn(32, 256, device="cuda")


# One mode after the other in one process; each mode's peaks since the last.
for mode in modes:
    torch.cuda.reset_peak_memory_stats()
    model = build(mode)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(batch(mode)).sum().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    result["peaks"][mode] = {"max_memory_reserved": torch.cuda.max_memory_reserved(),
                             "max_memory_allocated": torch.cuda.max_memory_allocated()}
    del model, opt
    gc.collect()  # DDP's and FSDP's reference cycles: freed now, not at a later collection inside the next mode

if "objects" in modes:
    gathered = [None] * world
    dist.all_gather_object(gathered, {"from": rank})
    sent = [{"config": "only the source's"} if rank == 0 else None]
    dist.broadcast_object_list(sent, src=0)
    scattered = [None]
    dist.scatter_object_list(scattered, [f"for {r}" for r in range(world)] if rank == 0 else None, src=0)
    at_dst = [None] * world if rank == 0 else None
    dist.gather_object(f"from {rank}", at_dst, dst=0)
    result["objects"] = {"all_gather_object": gathered, "broadcast_object_list": sent,
                         "scatter_object_list": scattered, "gather_object": at_dst}

torch.cuda.synchronize()


def nccl_memory():
    """NCCL's own device memory as the library reports it (ncclCommMemStats,
    NCCL >= 2.29.7), for make gpu-check to hold the virtual NCCL's model to."""
    try:
        import ctypes

        comm = dist.group.WORLD._get_backend(torch.device("cuda"))._comm_ptr()
        value = ctypes.c_uint64()
        rc = ctypes.CDLL("libnccl.so.2").ncclCommMemStats(ctypes.c_void_p(comm), 3, ctypes.byref(value))  # GpuMemTotal
        return {"gpu_mem_total": value.value} if rc == 0 else {"error": f"ncclCommMemStats returned {rc}"}
    except Exception as e:  # an older NCCL, a torch without _comm_ptr
        return {"error": f"{type(e).__name__}: {e}"}


# The process's peaks: the most of each mode's (each counted from the last reset).
result["max_memory_reserved"] = max(p["max_memory_reserved"] for p in result["peaks"].values())
result["max_memory_allocated"] = max(p["max_memory_allocated"] for p in result["peaks"].values())
free, total = torch.cuda.mem_get_info()
result["device_used"] = total - free
dist.all_reduce(torch.zeros(1, device="cuda"))  # the communicator exists (a world of 1 may not need one)
result["nccl"] = nccl_memory()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
