"""NCCL's own device memory, stage by stage, for one rank under torchrun
(backend nccl): what the card's driver says is used outside torch's caching
allocator after each step that can make NCCL allocate: the default group's
first collective, an all-to-all, point-to-point, and the sub-communicators a
3-D DeviceMesh creates. make gpu-check runs it on the card and on the
virtual GPU of the same model, to hold the virtual NCCL's model (docs/vgpu.md)
to the card where ncclCommMemStats is missing (NCCL < 2.29.7).

    torchrun --nproc-per-node 1 nccl_stages.py OUT_DIR

Writes OUT_DIR/rankN.json: {"stages": [{"stage", "outside_allocator", "delta"}], ...}."""

import json
import os
import sys

import torch
import torch.distributed as dist

out_dir = sys.argv[1]
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
torch.zeros(1, device="cuda")  # the context exists before the first stage
stages: list[dict] = []


def outside_allocator() -> int:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def stage(name: str) -> None:
    now = outside_allocator()
    stages.append({"stage": name, "outside_allocator": now,
                   "delta": now - stages[-1]["outside_allocator"] if stages else 0})


def attempt(name: str, call) -> None:
    try:
        call()
        stage(name)
    except Exception as e:  # a call this NCCL or torch refuses: say so, go on
        stages.append({"stage": name, "error": f"{type(e).__name__}: {e}"[:300]})


stage("context")
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank, world = dist.get_rank(), dist.get_world_size()
stage("init_process_group")
attempt("all_reduce", lambda: dist.all_reduce(torch.ones(1 << 20, device="cuda")))
attempt("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(1 << 20, device="cuda"),
                                                              torch.ones(1 << 20, device="cuda")))


def point_to_point():
    peer = (rank + 1) % world
    src = (rank - 1) % world
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(1 << 20, device="cuda"), peer),
                                    dist.P2POp(dist.irecv, torch.empty(1 << 20, device="cuda"), src)])
    for w in works:
        w.wait()


attempt("batch_isend_irecv", point_to_point)


def mesh_3d():
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (1, 1, world), mesh_dim_names=("pp", "dp", "tp"))
    for name in ("pp", "dp", "tp"):
        dist.all_reduce(torch.ones(1 << 20, device="cuda"), group=mesh.get_group(name))


attempt("mesh_3d_groups", mesh_3d)
attempt("new_group", lambda: dist.all_reduce(torch.ones(1 << 20, device="cuda"),
                                             group=dist.new_group(list(range(world)))))
dist.destroy_process_group()
stage("destroy_process_group")
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world_size": world, "torch": torch.__version__,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())), "stages": stages}, f, indent=2)
