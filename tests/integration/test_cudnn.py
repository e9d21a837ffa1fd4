"""cuDNN on the virtual GPU: torch's real cuDNN paths (the v8 convolution API
through cudnn_frontend, batch norm, RNNs, cuDNN attention) run against the
stand-in libcudnn, which answers each workspace from the tables recorded on
cards (csrc/vgpu/cudnn_tables.h). Marked `cuda`: they run on the virtual GPU
(pytest --vgpu), where the stand-in replaces cuDNN."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import allocscope
from allocscope.allocator.recorded import recorded_reserved
from allocscope.attribution import attribute
from allocscope.attribution.categories import CATEGORIES
from allocscope.attribution.workspaces import LIBRARY_WORKSPACE_OPS
from allocscope.attribution.ops import op_names

from ..replay import assert_exact

pytestmark = pytest.mark.cuda

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLES = os.path.join(ROOT, "benchmarks", "cudnn_tables.py")
CARD = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _virtual_gpu_with_cudnn():
    from allocscope import vgpu
    from allocscope.vgpu import cudnn

    if not vgpu.active() or not cudnn.stand_in() or torch.cuda.get_device_name() != CARD:
        pytest.skip("needs the virtual H100 with allocscope's cuDNN stand-in (pytest --vgpu H100-80GB)")


def _run(args, table=None, timeout=600):
    env = dict(os.environ)
    if table is not None:
        env["ALLOCSCOPE_VGPU_CUDNN_TABLES"] = str(table)
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _rows(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]


def test_torch_sees_cudnn_and_takes_its_paths():
    assert torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
    assert torch.backends.cudnn.version() >= 90000
    conv = torch.nn.Conv2d(3, 8, 3).cuda()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        conv(torch.randn(2, 3, 16, 16, device="cuda")).sum().backward()
    names = {e.name for e in prof.events()}
    assert "aten::cudnn_convolution" in names


def test_a_table_recorded_on_the_virtual_gpu_reads_back_as_written(tmp_path):
    """benchmarks/cudnn_tables.py builds each problem's key as the stand-in
    does: rows given bytes read back exactly at their batch size, and scaled
    from the nearest batch size at another."""
    empty = tmp_path / "empty.tsv"
    empty.write_text("# no rows\n")
    _run([TABLES, "--out", str(tmp_path / "found.tsv"), "--batch", "2"], table=empty)
    found = _rows(tmp_path / "found.tsv")
    assert {r[2] for r in found} == {"conv_fprop", "conv_dgrad", "conv_wgrad", "bn_fwd_ws", "bn_reserve",
                                     "bn_bwd_ws"}
    assert all(r[5] == "0" for r in found)  # no rows: no workspace
    rng = np.random.default_rng(0)
    written = {}
    with open(tmp_path / "table.tsv", "w") as f:
        for card, version, op, batch, key, _ in found:
            written[(op, key)] = int(rng.choice([0, 512, 1000, 3 << 20, 123_456_789]))
            f.write(f"{card}\t{version}\t{op}\t{batch}\t{key}\t{written[(op, key)]}\n")
    _run([TABLES, "--out", str(tmp_path / "read.tsv"), "--batch", "2,3"], table=tmp_path / "table.tsv")
    read = _rows(tmp_path / "read.tsv")
    assert len(read) == 2 * len(found)
    for _, _, op, batch, key, got in read:
        want = written[(op, key)]
        if batch == "3":  # the nearest recorded batch size (2), scaled, rounded up to 512 B
            want = -(-want * 3 // 2 // 512) * 512
        assert int(got) == want, (op, batch, key)


CONV_STEP = """\
import json, sys, torch, torch.nn as nn
import allocscope
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU()).cuda()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x = torch.randn(8, 3, 32, 32, device="cuda")
torch.cuda.reset_peak_memory_stats()
with allocscope.record(sys.argv[1], device="cuda") as rec:
    rec.watch(net, opt)
    for _ in range(2):
        net(x).sum().backward()
        opt.step()
        opt.zero_grad()
print(json.dumps({"peak": torch.cuda.max_memory_reserved()}))
"""


def test_a_cudnn_convolution_step_records_its_workspaces(tmp_path):
    """Each convolution asks for the workspace its table row gives, inside
    its cuDNN op: recorded as a workspace with that op named; the capture
    replays exactly and its peak is torch's."""
    (tmp_path / "step.py").write_text(CONV_STEP)
    # the net's problems, with their keys as the recorder builds them
    sys.path.insert(0, os.path.dirname(TABLES))
    try:
        from cudnn_tables import conv_key
    finally:
        sys.path.remove(os.path.dirname(TABLES))
    x, y, z = torch.empty(8, 3, 32, 32), torch.empty(8, 32, 32, 32), torch.empty(8, 64, 16, 16)
    keys = [conv_key(x, torch.empty(32, 3, 3, 3), y, [1, 1], [1, 1], [1, 1]),
            conv_key(y, torch.empty(64, 32, 3, 3), z, [1, 1], [2, 2], [1, 1])]
    sizes = {("conv_fprop", 0): 1 << 20, ("conv_dgrad", 1): 3 << 20, ("conv_wgrad", 0): 5 << 20,
             ("conv_wgrad", 1): 7 << 20}
    with open(tmp_path / "table.tsv", "w") as f:
        for (op, i), size in sizes.items():
            f.write(f"{CARD}\t{torch.backends.cudnn.version()}\t{op}\t8\t{keys[i]}\t{size}\n")
    capture = tmp_path / "step.alsc"
    peak = json.loads(_run([str(tmp_path / "step.py"), str(capture)], table=tmp_path / "table.tsv"))["peak"]
    cap = allocscope.load(capture)
    rep = assert_exact(cap)
    assert int(recorded_reserved(cap).max()) == peak == rep.peak_reserved
    att = attribute(cap)
    names = op_names(cap, att.op)
    workspace = CATEGORIES.index("workspace")
    spaces = [(int(att.size[r]), names[int(att.op[r])].chain[-1]) for r in np.flatnonzero(att.category == workspace)]
    # every row of the table, at each of the two steps, inside a cuDNN op
    assert sorted(s for s, _ in spaces) == sorted(list(sizes.values()) * 2)
    assert {op for _, op in spaces} <= LIBRARY_WORKSPACE_OPS
    assert {op for s, op in spaces if s == 1 << 20} == {"aten::cudnn_convolution"}


def test_recurrent_networks_lay_their_weights_out_as_torch_checks_and_replay(tmp_path):
    """torch's RNNs view their parameters into cuDNN's weight space at the
    addresses the stand-in gives (torch asserts the layout) and keep cuDNN's
    reserve space for backward."""
    # sizes past the small pool's 1 MiB: the recording makes segments for the replay to follow
    lstm = torch.nn.LSTM(128, 256, num_layers=2, batch_first=True, bidirectional=True).cuda()
    gru = torch.nn.GRU(128, 256).cuda()
    torch.cuda.empty_cache()  # what earlier tests left cached could serve it all: no segment to follow
    with allocscope.record(tmp_path / "rnn.alsc", device="cuda", ops=True):
        out, _ = lstm(torch.randn(16, 100, 128, device="cuda"))
        out.sum().backward()
        out, _ = gru(torch.randn(100, 16, 128, device="cuda"))
        out.sum().backward()
    flat = lstm._flat_weights[0]
    assert all(w.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for w in lstm._flat_weights)
    cap = allocscope.load(tmp_path / "rnn.alsc")
    assert_exact(cap)
    ops = {op for name in op_names(cap, cap.events.op).values() for op in name.chain}
    assert "aten::_cudnn_rnn" in ops and "aten::_cudnn_rnn_backward" in ops


def test_attention_takes_cudnn_where_torch_would_on_the_card(tmp_path):
    q = torch.randn(8, 16, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    choice = torch._fused_sdp_choice(q, q, q, is_causal=True)
    torch.cuda.empty_cache()  # what earlier tests left cached could serve it all: no segment to follow
    with allocscope.record(tmp_path / "sdpa.alsc", device="cuda", ops=True):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    cap = allocscope.load(tmp_path / "sdpa.alsc")
    assert_exact(cap)
    if choice == torch.nn.attention.SDPBackend.CUDNN_ATTENTION.value:
        ops = {op for name in op_names(cap, cap.events.op).values() for op in name.chain}
        assert any("cudnn_attention" in op for op in ops), ops
