"""Values that decide memory (docs/vgpu.md, "Values"): on the virtual GPU the ops that steer shapes and control
flow compute for real, selections over uncomputed values pick by the routing choice, and --compute all computes
what it can. The probes hold on a card too; what depends on uncomputed values is the virtual GPU's alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import allocscope
from allocscope import EventKind, vgpu

from ..conftest import ROOT

pytestmark = pytest.mark.cuda
virtual_only = pytest.mark.skipif("not __import__('allocscope').vgpu.active()",
                                  reason="uncomputed values exist on the virtual GPU only")
MOE = os.path.join(ROOT, "examples", "moe_train.py")
EXPERTS_RUN = os.path.join(ROOT, "tests", "scripts", "moe_experts_run.py")
GENERATE = os.path.join(ROOT, "examples", "generate.py")
SMALL_MOE = ["--hidden", "256", "--intermediate", "512", "--layers", "2", "--dtype", "float32",
             "--batch-size", "2", "--seq-len", "64"]


def test_the_probes_give_a_cards_values():
    assert torch.ones(1000, device="cuda").sum().item() == 1000.0
    assert torch.nonzero(torch.ones(1000, device="cuda")).shape == (1000, 1)
    x = torch.arange(1000, device="cuda")
    assert x[x >= 500].shape == (500,)
    y = torch.tensor([1, 2, 3], device="cuda")
    assert (y * 2).tolist() == [2, 4, 6]
    assert torch.unique(torch.tensor([3, 1, 3, 2], device="cuda")).tolist() == [1, 2, 3]
    assert torch.repeat_interleave(torch.tensor([1, 2], device="cuda"), torch.tensor([2, 3], device="cuda")).shape \
        == (5,)


@virtual_only
def test_random_numbers_on_the_device_leave_the_programs_cpu_stream_as_it_was():
    torch.manual_seed(3)
    state = torch.get_rng_state()
    masked = torch.nn.functional.dropout(torch.ones(1000, device="cuda"), 0.5)  # native_dropout: no generator
    drawn = torch.rand(100, device="cuda")
    assert torch.equal(torch.get_rng_state(), state)
    assert 0 < int((masked == 0).sum().item()) < 1000 and 0.0 < drawn.min().item() < drawn.max().item() < 1.0
    torch.manual_seed(3)
    torch.nn.functional.dropout(torch.ones(1000, device="cuda"), 0.5)
    assert torch.equal(torch.rand(100, device="cuda").cpu(), drawn.cpu())  # as repeatable as on a card


def _scaler_scale(device: str, steps: int) -> float:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, growth_interval=1)
    for _ in range(steps):
        loss = model(torch.randn(4, 8).to(device)).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return scaler.get_scale()


def test_gradscaler_scales_as_a_cpu_gradscaler_with_the_same_settings():
    assert _scaler_scale("cuda", 3) == _scaler_scale("cpu", 3) == 65536.0 * 2 ** 3


def test_a_loss_over_the_labels_mask_allocates_what_the_cpu_run_does(tmp_path):
    def loss(device):
        logits = torch.zeros(4, 128, 1000, device=device, requires_grad=True)
        labels = torch.full((4, 128), -100, dtype=torch.int64)
        labels[:, 37:101] = 7  # made on the host, as a data loader makes them
        labels = labels.to(device)
        selected = logits[labels != -100]
        torch.nn.functional.cross_entropy(selected, labels[labels != -100]).backward()
        return selected.shape

    assert loss("cuda") == loss("cpu") == (4 * 64, 1000)
    with allocscope.record(tmp_path / "cuda.alsc", device="cuda"):
        loss("cuda")
    ev = allocscope.load(tmp_path / "cuda.alsc").events
    sizes = ev.size[ev.kind == EventKind.ALLOC]
    assert (4 * 64 * 1000 * 4) in sizes  # the selected logits, sized from the computed mask


ACCUMULATING = """
import json, sys, torch
x = torch.randn(512, 1024, device="cuda", requires_grad=True)
w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
for _ in range(2):
    h = x @ w                                               # used twice: its gradients accumulate
    y = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).sum()
    y.backward()
print(json.dumps(torch.cuda.memory_stats()["allocation.all.allocated"]))
"""


@virtual_only
@pytest.mark.parametrize("script", ["train", "accumulating"])
def test_computing_values_leaves_a_steps_allocations_as_they_were(script, tmp_path):
    """What does not depend on values allocates the same with values computed as without: the same requests in
    the same order (a storage the values registry looked at must not change autograd's in-place accumulation)."""
    if script == "train":
        command = [os.path.join(ROOT, "examples", "train.py"), "--steps", "2"]
    else:
        (tmp_path / "acc.py").write_text(ACCUMULATING)
        command = [str(tmp_path / "acc.py")]
    sizes = {}
    for mode in ("none", "values"):
        capture = tmp_path / f"{mode}.alsc"
        p = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "H100-80GB", "--compute", mode,
                            "--stacks", "none", "-o", str(capture), "--", sys.executable, *command],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        ev = allocscope.load(capture).events
        sizes[mode] = ev.size[ev.kind == EventKind.ALLOC].tolist()
    assert sizes["values"] == sizes["none"] and len(sizes["none"]) > 10


@virtual_only
def test_uncomputed_values_read_zero_and_a_router_over_them_balances():
    a = torch.randn(2048, 64, device="cuda") @ torch.randn(64, 8, device="cuda")  # a matmul computes nothing
    assert a.sum().item() == 0.0 and a.cpu().abs().sum().item() == 0.0
    assert isinstance(a.max().item(), float) and a.long().sum().item() == 0 and a.bool().any().item() is False
    picks = torch.topk(torch.softmax(a, dim=-1), 2, dim=-1).indices
    assert torch.bincount(picks.view(-1).cpu(), minlength=8).tolist() == [512] * 8
    assert torch.argmax(torch.randn(3, 64, device="cuda") @ torch.randn(64, 32000, device="cuda"), -1).tolist() \
        == [16000] * 3  # over a vocabulary: its middle, never an end-of-sequence token at either end


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@virtual_only
def test_large_fills_cost_host_memory_only_once_read(tmp_path):
    before = _resident()
    kept = [torch.zeros(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]  # 512 MiB of zeros
    assert _resident() - before < 64 << 20  # none written yet
    stale = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    from allocscope.vgpu.host_tensors import host_alias
    host_alias(stale).fill_(9)  # what an earlier tensor left in the block
    stale.zero_()
    stale[:10] = 3  # a computed op writes part of it: the fill is written first
    assert stale.sum().item() == 30 and kept[3].sum().item() == 0 and kept[5][-1].item() == 0


@virtual_only
def test_an_allocation_inside_a_computed_op_keeps_the_programs_line(tmp_path):
    import inspect

    x = torch.arange(1 << 20, device="cuda")
    with allocscope.record(tmp_path / "line.alsc", device="cuda"):
        line = inspect.currentframe().f_lineno + 1
        y = x * 3
    assert y[5].item() == 15
    cap = allocscope.load(tmp_path / "line.alsc")
    (alloc,) = np.flatnonzero(cap.events.kind == EventKind.ALLOC)
    top = cap.stack(cap.events.stack[alloc])[0]
    assert (top.filename, top.line) == (__file__, line)


def _run(args, *, gpu=True, values=(), record=None, cwd=None):
    cmd = [sys.executable, *args]
    if gpu:
        head = [sys.executable, "-m", "allocscope", "run", "--gpu", "H100-80GB", *values]
        cmd = head + (["--no-record"] if record is None else ["-o", str(record)]) + ["--", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# (the second family costs make test half a minute a torch: make test-full runs it)
FAMILIES = ["mixtral", pytest.param("qwen2_moe", marks=pytest.mark.heavy)]


@virtual_only
@pytest.mark.parametrize("family", FAMILIES)
def test_moe_routing_computed_exactly_is_the_cpu_runs(family):
    pytest.importorskip("transformers")
    args = [MOE, *SMALL_MOE, "--family", family]
    cpu = _run([*args, "--device", "cpu"], gpu=False)
    exact = _run(args, values=["--compute", "all"])
    assert exact["tokens_per_expert"] == cpu["tokens_per_expert"]
    assert exact["loss"] == pytest.approx(cpu["loss"], rel=1e-5)
    # (the eager experts loop, which indexes tokens by the mask nonzero() finds)
    eager = _run([*args, "--experts-implementation", "eager"], values=["--compute", "all"])
    assert eager["tokens_per_expert"] == cpu["tokens_per_expert"]


@virtual_only
@pytest.mark.parametrize("family", FAMILIES)
def test_balanced_routing_runs_every_expert_with_its_share(family, tmp_path):
    pytest.importorskip("transformers")
    out = _run([EXPERTS_RUN, *SMALL_MOE, "--family", family])
    tokens, k, experts = 128, 2, 8
    for layer in out["tokens_per_expert"]:
        assert all(abs(n - tokens * k / experts) <= 1 for n in layer)
    assert out["experts_run"] == experts * 2  # every expert of both layers ran its tokens
    worst = _run([EXPERTS_RUN, *SMALL_MOE, "--family", family], values=["--routing", "worst"])
    assert [layer[:k] for layer in worst["tokens_per_expert"]] == [[tokens] * k] * 2
    assert worst["experts_run"] == k * 2


@virtual_only
@pytest.mark.parametrize("routing", ["balanced", "worst"])
def test_each_routings_capture_replays_exactly_and_names_its_routing(routing, tmp_path):
    pytest.importorskip("transformers")
    capture = tmp_path / f"{routing}.alsc"
    out = _run([MOE, *SMALL_MOE], values=["--routing", routing], record=capture)
    p = subprocess.run([sys.executable, "-m", "allocscope", "report", "--json", str(capture)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["capture"]["virtual_gpu_values"] == {"compute": "values", "routing": routing}
    assert doc["allocator"]["replay"]["exact"]
    assert doc["peak_reserved"]["reserved_bytes"] == out["max_reserved"]
    text = subprocess.run([sys.executable, "-m", "allocscope", "report", str(capture)], capture_output=True,
                          text=True, timeout=300).stdout
    assert f"MoE routing where a router's logits were not computed: {routing}" in text


@virtual_only
@pytest.mark.parametrize("options", [["--cache", "dynamic"], ["--cache", "static"], ["--do-sample"]])
def test_generate_runs_exactly_max_new_tokens_steps(options):
    pytest.importorskip("transformers")
    n = 6
    out = _run([GENERATE, "--layers", "2", "--hidden", "256", "--intermediate", "512", "--heads", "4",
                "--kv-heads", "2", "--batch-size", "2", "--prompt-len", "16", "--max-new-tokens", str(n), *options])
    assert out["forward_passes"] == n and out["new_tokens"] == n


def test_bad_values_settings_are_one_line_errors():
    with pytest.raises(vgpu.VirtualGpuError, match="routing 'random'"):
        vgpu.environment("H100-80GB", routing="random")
    with pytest.raises(vgpu.VirtualGpuError, match="compute 'some'"):
        vgpu.environment("H100-80GB", compute="some")
    p = subprocess.run([sys.executable, "-m", "allocscope", "run", "--routing", "worst", "--no-record", "--",
                        sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "give --gpu too" in p.stderr and "Traceback" not in p.stderr


@virtual_only
def test_fit_gives_balanced_and_worst_routing_side_by_side(tmp_path):
    pytest.importorskip("transformers")
    # the eager experts loop: one expert's activations at a time, sized by its tokens
    workload = ["--hidden", "256", "--intermediate", "2048", "--layers", "1", "--dtype", "float32", "--batch-size",
                "8", "--seq-len", "512", "--vocab", "64", "--experts-implementation", "eager"]
    p = subprocess.run([sys.executable, "-m", "allocscope", "fit", "--gpu", "L4-24GB", "--routing", "balanced",
                        "--routing", "worst", "--json", "-o", str(tmp_path / "fit"), "--", sys.executable, MOE,
                        *workload], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    cards = {c["routing"]: c for c in json.loads(p.stdout)["cards"]}
    assert set(cards) == {"balanced", "worst"} and all(c["verdict"] == "fits" for c in cards.values())
    assert {os.path.basename(c["capture"]) for c in cards.values()} == \
        {"L4-24GB.routing=balanced.alsc", "L4-24GB.routing=worst.alsc"}
    largest = {}
    for routing, card in cards.items():
        cap = allocscope.load(os.path.join(tmp_path, "fit", os.path.basename(card["capture"])))
        assert cap.metadata["virtual_gpu"]["values"]["routing"] == routing
        largest[routing] = int(cap.events.size[cap.events.kind == EventKind.ALLOC].max())
    # an expert's gate and up projections for its tokens: all 4,096 of them under the worst routing
    assert largest["worst"] == 4096 * 2 * 2048 * 4 > largest["balanced"]


COMPILED = """
import json, torch
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
step = torch.compile(model)
x = torch.randn(32, 64, device="cuda")
for _ in range(2):
    logits = step(x)                                   # Inductor's Triton kernels compute nothing
    picks = torch.topk(torch.softmax(logits, -1), 2, -1).indices
    logits.sum().backward()
print(json.dumps(torch.bincount(picks.view(-1).cpu(), minlength=8).tolist()))
"""


@virtual_only
@pytest.mark.heavy
def test_a_compiled_models_uncomputed_outputs_route_by_the_choice(tmp_path):
    (tmp_path / "compiled.py").write_text(COMPILED)
    assert _run([str(tmp_path / "compiled.py")]) == [8] * 8
    assert _run([str(tmp_path / "compiled.py")], values=["--routing", "worst"]) == [32, 32, 0, 0, 0, 0, 0, 0]
