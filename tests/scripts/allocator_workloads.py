"""GPU workloads for the caching-allocator model, each recorded to a capture:

    python tests/scripts/allocator_workloads.py fragment OUT.alsc
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python tests/scripts/allocator_workloads.py fragment OUT.alsc
    python tests/scripts/allocator_workloads.py oom OUT.alsc

fragment: a watched transformer-style block trained on growing sequence
lengths (the pattern that strands cached memory in segments sized for
earlier, smaller batches), with one side-stream use (record_stream) per step
and an empty_cache() halfway. oom: the same model under
set_per_process_memory_fraction, with the sequence length growing until the
allocator gives up; the OOM is caught and recording stops cleanly.

Used by tests/data/make_fixtures.py (--allocator) and
tests/integration/test_allocator_cuda.py. Prints the measured peak reserved
bytes as the last line.
"""

import sys

import torch
from torch import nn

import allocscope


class Block(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def step(model, opt, seq: int, side: torch.cuda.Stream) -> None:
    x = torch.randn(8, seq, 256, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    # A tensor used on a side stream: its free waits for that stream.
    t = torch.empty(seq * 1024, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        t.mul_(2)
    t.record_stream(side)
    del t


def fragment(path: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(2)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    side = torch.cuda.Stream()
    with allocscope.record(path, device="cuda", ops=True) as rec:
        rec.watch(model, opt)
        for i, seq in enumerate(range(64, 64 + 24 * 40, 40)):
            step(model, opt, seq, side)
            if i == 12:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        torch.cuda.synchronize()
    print(torch.cuda.max_memory_reserved())


def oom(path: str) -> None:
    torch.manual_seed(0)
    total = torch.cuda.get_device_properties(0).total_memory
    model = nn.Sequential(*[Block() for _ in range(2)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    side = torch.cuda.Stream()
    torch.cuda.set_per_process_memory_fraction((1 << 30) / total)  # 1 GiB for this process's allocator
    with allocscope.record(path, device="cuda", ops=True) as rec:
        rec.watch(model, opt)
        try:
            for seq in range(256, 1 << 16, 256):
                step(model, opt, seq, side)
        except torch.cuda.OutOfMemoryError:
            pass
        torch.cuda.synchronize()
    print(torch.cuda.max_memory_reserved())


def settings(path: str) -> None:
    """The program changes the allocator's rounding twice while recording
    (torch.cuda.memory._set_allocator_settings), between requests whose
    blocks and segments the rounding decides, after taking a snapshot of
    its own."""
    MiB = 1 << 20
    with allocscope.record(path, device="cuda", ops=True):
        torch.cuda.memory._snapshot()  # the program's own snapshot: a SNAPSHOT event before the changes
        held = [torch.empty(int(90.5 * MiB), dtype=torch.uint8, device="cuda") for _ in range(2)]
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
        held += [torch.empty(int(90.5 * MiB), dtype=torch.uint8, device="cuda") for _ in range(2)]
        del held[:2]
        held.append(torch.empty(int(70.5 * MiB), dtype=torch.uint8, device="cuda"))
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:[256:1,>:8]")
        held += [torch.empty(n * 3 * MiB + 4096, dtype=torch.uint8, device="cuda") for n in range(1, 12)]
        del held
    print(torch.cuda.max_memory_reserved())


def baseline_order(path: str) -> None:
    """Recording starts with two free blocks of equal size in two small
    segments, the older one at the higher address (the lower address was
    freed and reused): torch >= 2.12 takes the older segment's first, which
    the start baseline does not say. Then a request that ties."""
    KiB = 1 << 10
    older_low = [torch.empty(1024 * KiB, dtype=torch.uint8, device="cuda") for _ in range(2)]  # segment A
    older = [torch.empty(n * KiB, dtype=torch.uint8, device="cuda") for n in (896, 1024)]  # B: 128 KiB free
    del older_low
    torch.cuda.empty_cache()  # A goes back; the next segment takes its address
    newer = [torch.empty(n * KiB, dtype=torch.uint8, device="cuda") for n in (896, 1024)]  # C, below B
    with allocscope.record(path, device="cuda", ops=True):
        tie = torch.empty(100 * KiB, dtype=torch.uint8, device="cuda")
        more = [torch.empty(100 * KiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
        del tie, more
    del older, newer
    print(torch.cuda.max_memory_reserved())


def release_oversize(path: str) -> None:
    """Oversize free blocks (max_split_size_mb:40) in two whole segments and
    one expandable segment (expandable_segments turned on for it alone),
    then, under a memory fraction, a request no cached block fits: c10
    frees oversize blocks largest first, passing over the expandable
    segment's, before it releases every cached block (PyTorch's conformance
    suite met this on torch 2.11; the replay stopped at the expandable
    block)."""
    MiB = 1 << 20
    with allocscope.record(path, device="cuda", ops=True):
        torch.cuda.memory._set_allocator_settings("max_split_size_mb:40")
        whole = [torch.empty(40 * MiB, dtype=torch.uint8, device="cuda") for _ in range(2)]
        torch.cuda.memory._set_allocator_settings("expandable_segments:True,max_split_size_mb:40")
        grown = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        torch.cuda.memory._set_allocator_settings("max_split_size_mb:40")
        del whole, grown
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(200 * MiB / total)
        big = torch.empty(120 * MiB, dtype=torch.uint8, device="cuda")
        del big
        torch.cuda.set_per_process_memory_fraction(1.0)
    print(torch.cuda.max_memory_reserved())


if __name__ == "__main__":
    {"fragment": fragment, "oom": oom, "settings": settings,
     "baseline_order": baseline_order, "release_oversize": release_oversize}[sys.argv[1]](sys.argv[2])
