"""Attribution on a GPU (marked `cuda`: skipped where there is none): the
categories against PyTorch's own MemTracker on the same step, and the
measured totals against torch.cuda's statistics and the device's used
memory."""

import pytest
import torch

import allocscope
from allocscope.attribution import CATEGORIES, attribute, moment
from allocscope.reports import build_report
from allocscope.reports.report import analyse, find_mark

from .test_attribution_cpu import MODELS, storage_bytes

pytestmark = pytest.mark.cuda


def _expected(model, opt, x):
    """Bytes each category must hold now, from the tensors themselves."""
    return {
        "parameter": storage_bytes(model.parameters()),
        "buffer": storage_bytes(model.buffers()),
        "gradient": storage_bytes(p.grad for p in model.parameters() if p.grad is not None),
        "optimizer_state": storage_bytes(v for s in opt.state.values() for v in s.values()
                                         if isinstance(v, torch.Tensor) and v.is_cuda),
        "input": storage_bytes([x]),
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_categories_match_memtracker_and_the_allocator(tmp_path, name):
    """On the real caching allocator, for convolutional (BatchNorm),
    recurrent, attention (tied weights) and checkpointed training loops:
    parameter, buffer, gradient, optimizer state and input bytes exact at
    marks after forward, backward and the step; nothing unknown there or at
    the peaks; blocks (unsplit remainders included) equal to
    memory_allocated(); the waterfall ends at reserved and at the device's
    used memory."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    from allocscope import vgpu

    make_model, make_input = MODELS[name]
    torch.manual_seed(0)
    model = make_model().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)  # step counters on the GPU too
    mt = MemTracker()
    mt.track_external(model, opt)
    path = tmp_path / f"{name}.alsc"
    torch.cuda.reset_peak_memory_stats()
    expected, stats = {}, {}

    def mark(label, x):
        torch.cuda.synchronize()
        expected[label] = _expected(model, opt, x)
        stats[label] = (torch.cuda.memory_stats(), torch.cuda.mem_get_info())
        allocscope.mark(label)

    with allocscope.record(path, device="cuda") as rec:
        rec.watch(model, opt)
        with mt:
            for step in range(2):
                mt.reset_mod_stats()  # MemTracker follows one root forward at a time
                x = make_input().cuda()
                loss = model(x).float().square().mean()
                mark(f"forward {step}", x)
                loss.backward()
                mark(f"backward {step}", x)
                opt.step()
                if step == 1:
                    tracker = mt.get_tracker_snapshot("current")[torch.device("cuda", torch.cuda.current_device())]
                mark(f"step {step}", x)
                opt.zero_grad()
    cap = allocscope.load(path)
    an = analyse(cap)
    att, tl = an.att, an.tl
    assert an.replay is not None and an.replay.fidelity.exact and att.blocks_exact
    for label, want in expected.items():
        e = find_mark(cap, label)
        m = moment(att, e, tl)
        for category, nbytes in want.items():
            assert m.by_category[category] == nbytes, (label, category)
        assert m.by_category["unknown"] == 0, label
        st, (free, total) = stats[label]
        assert m.requested_bytes == st["requested_bytes.all.current"]
        assert m.allocated_bytes == st["allocated_bytes.all.current"], label  # real block sizes
        assert tl.reserved[e + 1] == st["reserved_bytes.all.current"]
        r = build_report(cap, at=label, analysis=an)
        gap = {i["item"]: i["bytes"] for i in r["gap"]}
        assert gap["allocator_rounding"] == m.rounded_bytes - m.requested_bytes
        assert gap["unsplit_remainder"] == m.allocated_bytes - m.rounded_bytes >= 0
        assert gap["cached_free"] == st["reserved_bytes.all.current"] - st["allocated_bytes.all.current"]
        assert r["theory"]["total"] + sum(gap.values()) == r["measured"]["total_bytes"]
        assert r["measured"]["basis"] == "device_used"
        assert r["measured"]["reserved_bytes"] == st["reserved_bytes.all.current"]
        used = total - free
        if vgpu.active():  # nothing outside the allocator changes after the start on the virtual GPU
            assert r["measured"]["device_used_bytes"] == used, label
        else:  # on a GPU, kernels and libraries take memory outside it on first use, at moments not recorded
            outside = r["measured"]["device_used_bytes"] - r["measured"]["reserved_bytes"]
            grew = outside - r["measured"].get("outside_allocator_at_start_bytes", outside)
            assert abs(r["measured"]["device_used_bytes"] - used) <= abs(grew) + 0.02 * used, label
    for which in ("allocated", "reserved"):
        assert moment(att, tl.peak(which), tl).by_category["unknown"] == 0, which
    assert tl.requested.max() == stats["step 1"][0]["requested_bytes.all.peak"]
    assert tl.allocated.max() == stats["step 1"][0]["allocated_bytes.all.peak"]
    # MemTracker counts 512-byte-rounded storage bytes per reference type
    e = find_mark(cap, "step 1")
    live = att.live(e)

    def rounded(category):
        return int(att.rounded[live & (att.category == CATEGORIES.index(category))].sum())

    assert rounded("parameter") == tracker[_MemRefType.PARAM]
    assert rounded("gradient") == tracker[_MemRefType.GRAD]
    assert rounded("optimizer_state") == tracker[_MemRefType.OPT]


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


def test_unsplit_remainders_are_named(tmp_path):
    """A cached 3 MiB block serving a 2.5 MiB request is handed out whole
    (the 0.5 MiB rest is too small to split off in the large pool): the
    waterfall names that remainder, and the blocks add up to
    memory_allocated()."""
    MiB = 1 << 20
    path = tmp_path / "unsplit.alsc"
    # On a stream of its own: cached blocks are per stream, and blocks that
    # earlier tests left cached (on a GPU, cuBLAS's and cuDNN's too) could
    # serve c before a's block does (torch hands out pooled streams again:
    # empty_cache drops what an earlier user of this one left cached).
    own = torch.cuda.Stream()
    torch.cuda.empty_cache()
    with allocscope.record(path, device="cuda"), torch.cuda.stream(own):
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(17 * MiB, dtype=torch.uint8, device="cuda")  # the rest of a's 20 MiB segment
        del a
        allocscope.mark("before")
        c = torch.empty(5 * MiB // 2, dtype=torch.uint8, device="cuda")  # reuses a's block, unsplit
        allocscope.mark("reused")
        allocated = torch.cuda.memory_allocated()
    cap = allocscope.load(path)
    an = analyse(cap)
    m = moment(an.att, find_mark(cap, "reused"), an.tl)
    assert m.allocated_bytes == allocated

    def gap(label):
        return {i["item"]: i["bytes"] for i in build_report(cap, at=label, analysis=an)["gap"]}

    before, after = gap("before"), gap("reused")  # earlier tests may have left memory live
    assert after["unsplit_remainder"] - before["unsplit_remainder"] == MiB // 2
    assert after["allocator_rounding"] == before["allocator_rounding"]  # 2.5 MiB is a multiple of 512 B
    del b, c
