"""FSDP2 training of a Llama-shaped decoder, as torchtitan sets it up: the
model made on the meta device, each block and the root sharded with
`fully_shard` (bf16 parameters, fp32 reductions), `to_empty` on the GPU,
AdamW, a few steps of random tokens. An ordinary torchrun script (backend
nccl): run it on many virtual cards, or one rank of a large job alone:

    allocscope run --gpu 8xH100-80GB -o llama.alsc -- torchrun --nproc-per-node 8 examples/fsdp_llama.py --size 1b
    allocscope fit --gpu H100-80GB --world-size 1024 -- python examples/fsdp_llama.py --size 7b

--memtracker runs the same steps under FakeTensorMode on torch's "fake"
process group with FSDPMemTracker (torch.distributed._tools), the estimator
torchtitan uses, and reports its peak instead (benchmarks/bench_many_gpus.py).
Each rank writes OUT/rankN.json with torch's peaks (with --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_zoo import Llama  # noqa: E402

SIZES = {
    # Llama-3.2-1B-like (32k vocabulary): 1.10B parameters
    "1b": dict(vocab=32000, d=2048, layers=16, heads=32, kv_heads=8, hidden=8192, positions=4096),
    # Llama-2-7B: 6.74B parameters
    "7b": dict(vocab=32000, d=4096, layers=32, heads=32, kv_heads=32, hidden=11008, positions=4096),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="1b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    parser.add_argument("--memtracker", action="store_true", help="FSDPMemTracker under FakeTensorMode instead")
    parser.add_argument("--out", help="folder for rankN.json")
    args = parser.parse_args()

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if args.memtracker:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=int(os.environ.get("RANK", 0)),
                                world_size=int(os.environ.get("WORLD_SIZE", 1)))
    else:
        dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    cfg = SIZES[args.size]
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (world,))  # outside FakeTensorMode: the mesh reads real tensors
    fake = contextlib.nullcontext()
    if args.memtracker:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake = FakeTensorMode()
    with fake:
        with torch.device("meta"):
            model = Llama(**cfg)
        params = sum(p.numel() for p in model.parameters())
        largest = max(sum(p.numel() for p in b.parameters()) for b in model.layers)
        if args.checkpoint:
            model.checkpointing = True
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model.to_empty(device="cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens = torch.randint(0, cfg["vocab"], (args.batch, args.seq + 1), device="cuda")

        def step() -> None:
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad()

        result = {"rank": rank, "world_size": world, "size": args.size, "parameters": params,
                  "largest_layer_parameters": largest, "batch": args.batch, "seq": args.seq}
        if args.memtracker:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            tracker = FSDPMemTracker(model, opt)
            tracker.track_inputs((tokens,))
            with tracker:
                for i in range(args.steps):
                    step()
                    if i == 0:
                        tracker.reset_mod_stats()
            peak = tracker.get_tracker_snapshot("peak")
            result["memtracker_peak_bytes"] = int(sum(v["Total"] for k, v in peak.items() if "cuda" in str(k)))
            result["memtracker_peak"] = {str(k): {str(c): int(b) for c, b in v.items()} for k, v in peak.items()}
        else:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
            result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    if args.out:
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
