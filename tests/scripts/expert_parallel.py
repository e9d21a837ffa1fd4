"""Expert parallelism with all-to-all token dispatch, unmodified for
allocscope: run under torchrun (backend nccl), as MoE layers do it by hand.

    expert_parallel.py OUT_DIR

Each rank holds 2 of the world x 2 experts and a router over all of them;
each token picks 2 experts (top-k over the router's logits). Each rank
counts the tokens it sends to each expert, the ranks exchange the counts
(all_to_all_single), then the tokens (all_to_all_single with those split
sizes, autograd through torch.distributed.nn), run them through their
experts, and send them back. A training step: forward, backward, AdamW.
Each rank writes OUT_DIR/rankN.json with torch's own peaks and how many
tokens it received."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

out_dir = sys.argv[1]
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
torch.manual_seed(rank)
local_experts, top_k, d, tokens = 2, 2, 512, 4096
n_experts = world * local_experts


class Expert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


router = torch.nn.Linear(d, n_experts).cuda()
experts = torch.nn.ModuleList(Expert() for _ in range(local_experts)).cuda()
optimizer = torch.optim.AdamW([*router.parameters(), *experts.parameters()])
received = []
for _ in range(2):
    x = torch.randn(tokens, d, device="cuda")
    weights, chosen = torch.softmax(router(x), dim=-1).topk(top_k, dim=-1)
    flat = chosen.flatten()
    order = flat.argsort()
    counts = torch.bincount(flat, minlength=n_experts)  # tokens this rank sends to each expert
    incoming = torch.empty_like(counts)
    dist.all_to_all_single(incoming, counts)  # per sender, per expert of this rank
    send = counts.view(world, local_experts).sum(1).tolist()
    per_expert = incoming.view(world, local_experts)
    recv = per_expert.sum(1).tolist()
    dispatched = x.repeat_interleave(top_k, dim=0)[order]
    arrived = dist_fn.all_to_all_single(torch.empty(sum(recv), d, device="cuda"), dispatched, recv, send)
    # The arrivals come by sender, each sender's by expert: regroup by expert, run, restore the order.
    by_sender = arrived.split(recv)
    outputs = [None] * world
    pieces = [[chunk.split(per_expert[s].tolist()) for s, chunk in enumerate(by_sender)]]
    expert_in = [torch.cat([pieces[0][s][e] for s in range(world)]) for e in range(local_experts)]
    expert_out = [experts[e](expert_in[e]) for e in range(local_experts)]
    sizes = [[int(per_expert[s][e]) for s in range(world)] for e in range(local_experts)]
    split_out = [o.split(sz) for o, sz in zip(expert_out, sizes)]
    back_in = torch.cat([split_out[e][s] for s in range(world) for e in range(local_experts)])
    back = dist_fn.all_to_all_single(torch.empty(sum(send), d, device="cuda"), back_in, send, recv)
    combined = torch.empty_like(back).index_copy(0, order, back).view(tokens, top_k, d)
    y = (combined * weights.unsqueeze(-1)).sum(1)
    y.pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    received.append(sum(recv))
torch.cuda.synchronize()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "received": received, "max_memory_reserved": torch.cuda.max_memory_reserved(),
               "max_memory_allocated": torch.cuda.max_memory_allocated()}, f)
dist.destroy_process_group()
