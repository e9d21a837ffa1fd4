"""A torch.compile'd model under a watch: torch.compile traces module hooks
into its graph, where allocscope's annotations (calls into its C extension)
would break the graph into pieces and so change what the compiled model
allocates. Inside a compiled region the watch's hooks do nothing (the root's
runs outside the graph): the compiled graphs are the same as unwatched, the
program allocates the same, and the memory still has its meaning
(parameters, activations, optimizer state). On CUDA (a GPU or the virtual
GPU): what the compiler itself allocates on the host would blur the
comparison on the CPU."""

import pytest
import torch
from torch import nn

import allocscope
from allocscope.attribution import attribute, moment
from allocscope.reports import build_report
from allocscope.reports.report import find_mark

pytestmark = pytest.mark.cuda


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
                                      for _ in range(3)))
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.blocks(x))


def _run(path, mode: str, style: str = "wrapper") -> tuple[int, list[int]]:
    """Two training steps of a compiled Net; the number of graphs compiled
    and the sizes the program allocated, in order."""
    from torch._dynamo.backends.registry import lookup_backend

    torch._dynamo.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with allocscope.record(path, device="cuda") as rec:
        if mode == "auto":
            rec.auto_watch()
        elif mode == "explicit":  # watched, then compiled: the watched model runs inside the compiled region
            rec.watch(model, opt)
        if style == "wrapper":
            compiled = torch.compile(model, backend=counting)
        else:  # compiled in place: the model's own call is the compiled region
            compiled = model
            model.compile(backend=counting)
        for step in range(2):
            loss = compiled(torch.randn(64, 128, device="cuda")).square().mean()
            allocscope.mark(f"forward {step}")
            loss.backward()
            opt.step()
            opt.zero_grad()
    cap = allocscope.load(path)
    sizes = cap.events.size[cap.events.kind == allocscope.EventKind.ALLOC].tolist()
    return len(graphs), sizes


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("style", ["wrapper", "in_place"])  # torch.compile(model), model.compile()
def test_a_compiled_model_is_watched_without_breaking_its_graph(tmp_path, style):
    _run(tmp_path / "warm.alsc", "none", style)  # cuBLAS's workspaces, made once per process, are made now
    graphs, sizes = _run(tmp_path / "none.alsc", "none", style)
    assert graphs == 1  # (forward and backward from one dynamo graph)
    for mode in ("auto", "explicit"):
        path = tmp_path / f"{mode}.alsc"
        assert _run(path, mode, style) == (graphs, sizes), mode  # the same graphs, the same allocations
        cap = allocscope.load(path)
        att = attribute(cap)
        assert [w["name"] for w in att.watches] and all(w["name"] != "" for w in att.watches)
        at = moment(att, find_mark(cap, "forward 1"))
        params = sum(p.numel() * 4 for p in Net().parameters())
        assert at.by_category["parameter"] == params, mode
        assert at.by_category["optimizer_state"] == 2 * params, mode  # Adam's two moments, from step 0
        # What autograd saved for backward is still named (through the compiled function's saved tensors).
        assert at.by_category["activation"] >= 3 * 64 * 512 * 4, mode
        # The textbook's activations are layer outputs, which the compiled graph hides: it says so.
        (note,) = [n for n in build_report(cap)["theory"]["notes"] if "no layer outputs" in n]
