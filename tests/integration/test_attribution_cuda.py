"""Attribution on a GPU (marked `cuda`: skipped where there is none): the
categories against PyTorch's own MemTracker on the same step, and the
measured totals against torch.cuda's statistics and the device's used
memory."""

import pytest
import torch

import allocscope
from allocscope.attribution import CATEGORIES, attribute, moment, timeline
from allocscope.reports import build_report
from allocscope.reports.report import find_mark

from .test_attribution_cpu import MODELS, storage_bytes

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", sorted(MODELS))
def test_categories_match_memtracker_and_the_allocator(tmp_path, name):
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    make_model, make_input = MODELS[name]
    torch.manual_seed(0)
    model = make_model().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)  # step counters on the GPU too
    mt = MemTracker()
    mt.track_external(model, opt)
    path = tmp_path / f"{name}.alsc"
    torch.cuda.reset_peak_memory_stats()
    with allocscope.record(path, device="cuda") as rec:
        rec.watch(model, opt)
        with mt:
            for step in range(2):
                mt.reset_mod_stats()  # MemTracker follows one root forward at a time
                x = make_input().cuda()
                loss = model(x).float().square().mean()
                loss.backward()
                opt.step()
                if step == 1:
                    torch.cuda.synchronize()
                    tracker = mt.get_tracker_snapshot("current")[torch.device("cuda", torch.cuda.current_device())]
                    stats = torch.cuda.memory_stats()
                    free, total = torch.cuda.mem_get_info()
                    expected = {
                        "parameter": storage_bytes(model.parameters()),
                        "gradient": storage_bytes(p.grad for p in model.parameters()),
                        "optimizer_state": storage_bytes(v for s in opt.state.values() for v in s.values()
                                                         if isinstance(v, torch.Tensor) and v.is_cuda),
                        "input": storage_bytes([x]),
                    }
                    allocscope.mark("step")
                opt.zero_grad()
    cap = allocscope.load(path)
    att = attribute(cap)
    e = find_mark(cap, "step")
    m = moment(att, e)
    for category, nbytes in expected.items():
        assert m.by_category[category] == nbytes, category
    # MemTracker counts 512-byte-rounded storage bytes per reference type
    live = att.live(e)

    def rounded(category):
        return int(att.rounded[live & (att.category == CATEGORIES.index(category))].sum())

    assert rounded("parameter") == tracker[_MemRefType.PARAM]
    assert rounded("gradient") == tracker[_MemRefType.GRAD]
    assert rounded("optimizer_state") == tracker[_MemRefType.OPT]
    # the allocator's own figures
    tl = timeline(att)
    assert tl.requested[e + 1] == stats["requested_bytes.all.current"]
    assert tl.reserved[e + 1] == stats["reserved_bytes.all.current"]
    assert tl.requested.max() == stats["requested_bytes.all.peak"]
    # rounding is estimated from the request: a whole unsplit block can only be larger
    assert tl.allocated[e + 1] <= stats["allocated_bytes.all.current"]
    r = build_report(cap, at="step")
    assert r["theory"]["total"] + sum(i["bytes"] for i in r["gap"]) == r["measured"]["total_bytes"]
    assert r["measured"]["basis"] == "device_used"
    used = total - free
    assert abs(r["measured"]["total_bytes"] - used) <= 0.02 * used


def test_watch_on_cuda_runs_backward_on_the_autograd_thread(tmp_path):
    model, make_input = MODELS["conv"][0]().cuda(), MODELS["conv"][1]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = tmp_path / "threads.alsc"
    with allocscope.record(path, device="cuda") as rec:
        rec.watch(model, opt)
        for _ in range(2):
            model(make_input().cuda()).square().mean().backward()
            opt.step()
            opt.zero_grad()
    att = attribute(allocscope.load(path))
    backward = att.phase == 2  # PHASES.index("backward")
    assert backward.any()
    # CUDA backward runs on the engine's device thread: its allocations are
    # attributed to modules through that thread's scopes
    named = att.module[backward & (att.thread != att.thread[att.phase == 1][0])] >= 0
    assert named.any()


def test_cublas_workspaces_are_named(tmp_path):
    """The workspace torch's cuBLAS handle takes for each stream it runs on
    (an allocation no tensor owns) is attributed as workspace, at the size
    the baseline reports; the matmuls' outputs are not."""
    x = torch.randn(64, 64, device="cuda")
    side = torch.cuda.Stream()
    path = tmp_path / "workspaces.alsc"
    with allocscope.record(path, device="cuda"):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x @ x  # a stream no matmul ran on before: a new workspace
        torch.cuda.synchronize()
    cap = allocscope.load(path)
    spaces = {w["address"]: w["size"] for w in cap.baseline("end")["workspaces"]}
    att = attribute(cap)
    workspace = CATEGORIES.index("workspace")
    named = {int(a): int(s) for a, s, c in zip(att.addr, att.size, att.category, strict=True) if c == workspace}
    assert named and set(named) <= set(spaces)
    assert all(spaces[a] == s for a, s in named.items())
    out = int(att.category[list(att.addr).index(y.data_ptr())])
    assert out != workspace
