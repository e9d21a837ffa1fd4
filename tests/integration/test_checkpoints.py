"""Checkpoints (docs/format.md, CHECKPOINT), on real training loops recorded
on the CPU and on the virtual GPU: a report of late steps read from the
last checkpoint before them (load(from_step=...), `report --steps`) says
what a whole read says; a whole read skips checkpoints; a file cut anywhere
reads as it did without them; files without checkpoints read as before.
A report at a mark (load(at_mark=...), `report --at`) read from the last
checkpoint before it says what a whole read says there."""

import gc
import json
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import allocscope
from allocscope.capture import format as F
from allocscope.capture.reader import TruncatedCaptureWarning
from allocscope.cli import main
from allocscope.common.errors import InputError
from allocscope.reports.report import build_report

from ..conftest import DATA
from ..support.cuda_runtime import cudart

STEPS = 24
EVERY = 1500  # events between checkpoints: several in a run of STEPS steps


@pytest.fixture(autouse=True)
def no_cached_segments_left():
    """Tests here use private pools (a MemPool, a CUDA graph): their
    segments stay cached after the pool is gone, and a later test's start
    baseline would hold them (the replay cannot tell such a pool was
    released)."""
    yield
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class Marker(nn.Module):
    """Marks where it runs: checkpoints are taken before marks, so some are
    taken with module scopes open, forward ones and (the recomputation of
    a checkpointed block runs in backward) backward ones."""

    def forward(self, x):
        allocscope.mark("inside")
        return x


class Model(nn.Module):
    """Attention, normalization, a recomputed (checkpointed) block and tied
    weights: activations, backward scopes and labels of every kind."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 32)
        self.block = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(32, 64), Marker(), nn.GELU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 40, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        h = self.block(self.embed(tokens))
        h = h + checkpoint(self.mlp, h, use_reentrant=False)
        return self.head(h)


def train(path, device, every=EVERY, outside=0):
    """A training run of STEPS steps, recorded and watched; `outside` bytes
    of device memory taken outside the allocator after its first step, as
    kernels and library handles take some on a GPU on first use."""
    import ctypes

    torch.manual_seed(0)
    model = Model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept = []  # outputs kept across steps: live at checkpoints, labelled by no watch
    held = ctypes.c_void_p()
    with allocscope.record(path, device=device, checkpoint_every=every) as rec:
        rec.watch(model, opt)
        for step in range(STEPS):
            if step == 1 and outside:
                assert cudart().cudaMalloc(ctypes.byref(held), ctypes.c_size_t(outside)) == 0
            tokens = torch.randint(0, 40, (4, 16), device=device)
            loss = model(tokens).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=step % 2 == 0)
            kept.append(loss.detach())
            if len(kept) > 5:
                kept.pop(0)
            if step % 4 == 1:
                allocscope.mark(f"step {step}")
    if held.value:
        assert cudart().cudaFree(held) == 0
    return path


def chunks(data):
    return [(kind, data[at:at + F.CHUNK_HEADER.size + length]) for kind, at, length, _ in
            F.chunk_headers(data, F.HEADER.size)]


def without_checkpoints(data):
    return data[:F.HEADER.size] + b"".join(c for kind, c in chunks(data) if kind != F.Chunk.CHECKPOINT)


# The allocator section's replay covers the events replayed: from a
# checkpoint, those after it. The state at the steps' peak is compared.
_REPLAYED = ("replay", "peak_reserved", "stats", "replayed_until", "timeline", "warnings")


def comparable(report):
    r = {k: v for k, v in report.items() if k not in ("capture", "warnings")}
    if "allocator" in r:
        r["allocator"] = {k: v for k, v in r["allocator"].items() if k not in _REPLAYED}
    return r


def assert_steps_read_from_checkpoints(path):
    """For every two steps: read from the last checkpoint before them, the
    report equals a whole read's, and read only as far as they need
    (through_step, as report --steps reads), a read's from the start
    that far. Returns the checkpoints read from."""
    whole = allocscope.load(path)
    used = set()
    last = max(int(i["iteration"]) for i in build_report(whole)["iterations"])
    for first in range(1, last):
        steps = (first, first + 1)
        part = allocscope.load(path, from_step=first)
        got = build_report(part, steps=steps)
        assert comparable(got) == comparable(build_report(whole, steps=steps)), first
        short = allocscope.load(path, through_step=first + 1, from_step=first)
        assert comparable(build_report(short, steps=steps)) == \
            comparable(build_report(allocscope.load(path, through_step=first + 1), steps=steps)), first
        if part.resumed:
            used.add(part.resumed["seq"])
            assert got["capture"]["partial"]["from_event"] == part.resumed["events"] > 0
            assert len(short.events) <= len(part.events) < len(whole.events)
    return used


# A report at a mark: the moment, and the estimate and waterfall there. Its
# other sections (the peak, iterations, timeline, the totals per site and
# op) cover the events read.
_AT_MARK = ("at", "theory", "gap", "measured")


def marks_of(cap):
    return list(dict.fromkeys(cap.label(i) for i in np.flatnonzero(cap.events.kind == F.EventKind.MARK).tolist()))


def assert_marks_read_from_checkpoints(path):
    """For every mark: read as report --at reads it (load(at_mark=...)),
    the report at the mark equals a whole read's. Returns the checkpoints
    read from."""
    whole = allocscope.load(path)
    used = set()
    for label in marks_of(whole):
        part = allocscope.load(path, at_mark=label)
        got, want = build_report(part, at=label), build_report(whole, at=label)
        assert {k: got[k] for k in _AT_MARK} == {k: want[k] for k in _AT_MARK}, label
        assert [(s["site"], s["live_bytes"]) for s in got["sites"] if s["live_bytes"]] == \
            [(s["site"], s["live_bytes"]) for s in want["sites"] if s["live_bytes"]], label
        if part.resumed:
            used.add(part.resumed["seq"])
            assert got["capture"]["partial"]["from_event"] == part.resumed["events"] > 0
            assert len(part.events) < len(whole.events)
    return used


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return train(str(tmp_path_factory.mktemp("ck") / "cpu.alsc"), "cpu")


def test_steps_read_from_a_checkpoint_say_what_a_whole_read_says(cpu_run):
    with open(cpu_run, "rb") as f:
        written = sum(kind == F.Chunk.CHECKPOINT for kind, _ in chunks(f.read()))
    assert written >= 3
    assert len(assert_steps_read_from_checkpoints(cpu_run)) >= 3  # every checkpoint served some step


def open_scopes(path):
    """Per checkpoint, the module scopes it put back open: (name, backward)."""
    from allocscope.capture import checkpoints
    from allocscope.capture.decode import EventColumns

    cap = allocscope.load(path)
    with open(path, "rb") as f:
        data = memoryview(f.read())
    out = []
    for c in checkpoints.find(data):
        block, seq = checkpoints.retained(data, c)
        cols = EventColumns(cap.version, 0, "numpy").add(block)
        at = (seq == c.seq) & ((cols["kind"] & F.KIND_MASK) == F.EventKind.MODULE_ENTER)
        out.append([(cap.strings[int(a)], bool(f & F.MODULE_BACKWARD))
                    for a, f in zip(cols["arg"][at].tolist(), cols["addr"][at].tolist(), strict=True)])
    return out


def test_a_mark_read_from_a_checkpoint_says_what_a_whole_read_says(cpu_run):
    assert len(assert_marks_read_from_checkpoints(cpu_run)) >= 3


def test_checkpoints_taken_inside_forward_and_backward(tmp_path):
    # A checkpoint at every chance: before each forward and each mark, so
    # also inside the model's forward and inside the recomputation of its
    # checkpointed block, in backward, with those scopes open.
    path = train(str(tmp_path / "every.alsc"), "cpu", every=1)
    scopes = open_scopes(path)
    assert any(s and not any(b for _, b in s) for s in scopes)  # forward scopes open
    assert any(any(b for _, b in s) for s in scopes)  # backward ones
    assert len(assert_steps_read_from_checkpoints(path)) >= STEPS - 3
    # Marks: "inside" is first met in the first forward (a read from the start).
    assert len(assert_marks_read_from_checkpoints(path)) >= len(range(1, STEPS, 4)) - 1


@pytest.mark.cuda
@pytest.mark.parametrize("settings", [None, "expandable_segments:True"])
def test_steps_read_from_a_checkpoint_on_the_virtual_gpu(tmp_path, settings):
    def set_allocator(text):
        with warnings.catch_warnings():  # the name torch 2.14 deprecates, which 2.11 has
            warnings.simplefilter("ignore", FutureWarning)
            torch.cuda.memory._set_allocator_settings(text)

    if settings:
        set_allocator(settings)
    try:
        path = train(str(tmp_path / "cuda.alsc"), "cuda", every=800)
    finally:
        if settings:
            torch.cuda.empty_cache()
            set_allocator("expandable_segments:False")
    assert len(assert_steps_read_from_checkpoints(path)) >= 2
    assert len(assert_marks_read_from_checkpoints(path)) >= 2
    # The replay from a checkpoint starts from its baseline and follows the recording.
    whole = allocscope.load(path)
    last = max(int(i["iteration"]) for i in build_report(whole)["iterations"])
    part = allocscope.load(path, from_step=last)
    assert part.resumed and part.baseline("start")["checkpoint"] == "checkpoint"
    r = build_report(part, steps=(last, last))
    assert r["allocator"]["replay"]["exact"]


@pytest.mark.cuda
def test_memory_outside_the_allocator_at_the_start_is_the_recordings_from_a_checkpoint(tmp_path):
    # On a GPU the memory outside the allocator grows after recording
    # starts; the report says how much there was at the start of recording,
    # not at the checkpoint it was read from (found on an H100: reads from
    # a checkpoint said nothing of it).
    path = train(str(tmp_path / "outside.alsc"), "cuda", every=800, outside=64 << 20)
    whole = allocscope.load(path)
    grew = build_report(whole)["measured"]
    assert grew["device_used_bytes"] - grew["reserved_bytes"] - grew["outside_allocator_at_start_bytes"] >= 64 << 20
    assert len(assert_steps_read_from_checkpoints(path)) >= 2
    assert len(assert_marks_read_from_checkpoints(path)) >= 2


def test_a_whole_read_skips_checkpoints(cpu_run):
    with open(cpu_run, "rb") as f:
        data = f.read()
    stripped = cpu_run + ".stripped"
    with open(stripped, "wb") as f:
        f.write(without_checkpoints(data))
    a, b = allocscope.load(cpu_run), allocscope.load(stripped)
    assert a.resumed is None and len(a.events) == len(b.events)
    for name in ("seq", "kind", "addr", "size", "stack", "op", "arg", "thread", "time_ns"):
        assert np.array_equal(getattr(a.events, name), getattr(b.events, name)), name
    assert a.baselines == b.baselines and a.footer == b.footer


def test_a_file_cut_anywhere_reads_as_without_checkpoints(cpu_run, tmp_path):
    with open(cpu_run, "rb") as f:
        data = f.read()
    parts = chunks(data)
    ends = np.cumsum([F.HEADER.size] + [len(c) for _, c in parts])
    checkpoints = [i for i, (kind, _) in enumerate(parts) if kind == F.Chunk.CHECKPOINT]
    # Cut right after a checkpoint, inside the chunk after it, and in the middle of one.
    cuts = [int(ends[checkpoints[1] + 1]), int(ends[checkpoints[1] + 1]) + 7, int(ends[len(parts) // 2]) - 3]
    for cut in cuts:
        path = str(tmp_path / f"cut{cut}.alsc")
        with open(path, "wb") as f:
            f.write(data[:cut])
        with open(path + ".stripped", "wb") as f:
            f.write(without_checkpoints(data[:cut]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncatedCaptureWarning)
            cap, plain = allocscope.load(path), allocscope.load(path + ".stripped")
            assert np.array_equal(cap.events.seq, plain.events.seq) and not cap.complete
            steps = sorted({int(i["iteration"]) for i in build_report(cap)["iterations"]})
            for first in steps[1:-1]:
                part = allocscope.load(path, from_step=first)
                assert comparable(build_report(part, steps=(first, first))) == \
                    comparable(build_report(cap, steps=(first, first))), (cut, first)


def test_a_damaged_checkpoint_is_not_read_from(cpu_run, tmp_path):
    with open(cpu_run, "rb") as f:
        data = bytearray(f.read())
    parts = chunks(bytes(data))
    ends = np.cumsum([F.HEADER.size] + [len(c) for _, c in parts])
    for i, (kind, _) in enumerate(parts):
        if kind == F.Chunk.CHECKPOINT:
            data[int(ends[i]) + F.CHUNK_HEADER.size + 5] ^= 0xFF  # every checkpoint's header
    path = str(tmp_path / "damaged.alsc")
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.warns(TruncatedCaptureWarning, match="checkpoint at byte .* is damaged; skipped"):
        part = allocscope.load(path, from_step=STEPS - 2)
    assert part.resumed is None  # read from the start, as without checkpoints
    assert comparable(build_report(part, steps=(STEPS - 2, STEPS - 2))) == \
        comparable(build_report(allocscope.load(cpu_run), steps=(STEPS - 2, STEPS - 2)))
    with pytest.warns(TruncatedCaptureWarning, match="damaged"):
        assert allocscope.load(path, at_mark=f"step {STEPS - 3}").resumed is None


def test_a_mark_is_not_read_from_beyond_a_damaged_checkpoint(cpu_run, tmp_path):
    # Each checkpoint lists the marks since the last: past a damaged one,
    # whether a mark precedes a checkpoint is unknown.
    from allocscope.capture import checkpoints

    with open(cpu_run, "rb") as f:
        data = bytearray(f.read())
    found = checkpoints.find(memoryview(bytes(data)))
    damaged = found[len(found) // 2]
    data[damaged.offset + F.CHUNK_HEADER.size + 5] ^= 0xFF
    path = str(tmp_path / "one_damaged.alsc")
    with open(path, "wb") as f:
        f.write(bytes(data))
    whole = allocscope.load(cpu_run)
    later = [m for m in marks_of(whole) if m.startswith("step")][-1]
    with pytest.warns(TruncatedCaptureWarning, match="damaged"):
        part = allocscope.load(path, at_mark=later)
    assert part.resumed is not None and part.resumed["seq"] < damaged.seq
    assert {k: build_report(part, at=later)[k] for k in _AT_MARK} == \
        {k: build_report(whole, at=later)[k] for k in _AT_MARK}


@pytest.mark.parametrize("name", ["cpu_train_v1.alsc", "cpu_watch_v2.alsc"])
def test_files_without_checkpoints_read_as_before(name):
    path = os.path.join(DATA, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not among the fixtures")
    a = allocscope.load(path, from_step=1)
    b = allocscope.load(path)
    assert a.resumed is None and np.array_equal(a.events.seq, b.events.seq)


def test_report_steps_reads_from_a_checkpoint(cpu_run, capsys):
    assert main(["report", cpu_run, "--steps", str(STEPS - 3), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["capture"]["partial"]["from_event"] > 0
    assert [i["iteration"] for i in r["iterations"]] == [STEPS - 3]


def test_report_at_reads_from_a_checkpoint(cpu_run, capsys):
    label = f"step {STEPS - 3}"
    assert main(["report", cpu_run, "--at", label, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["capture"]["partial"]["from_event"] > 0 and r["at"]["label"] == label
    assert main(["report", cpu_run, "--at", label]) == 0
    assert "(a checkpoint)" in capsys.readouterr().out
    # A mark not in the file: read from the start, so the error names every mark.
    assert main(["report", cpu_run, "--at", "no such mark"]) != 0
    assert "'step 1'" in capsys.readouterr().err


def test_checkpoints_can_be_turned_off(tmp_path):
    path = train(str(tmp_path / "off.alsc"), "cpu", every=0)
    with open(path, "rb") as f:
        assert not any(kind == F.Chunk.CHECKPOINT for kind, _ in chunks(f.read()))
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises((InputError, TypeError)):
            allocscope.record(str(tmp_path / "x.alsc"), checkpoint_every=bad)


def test_a_forged_checkpoint_is_a_one_line_error(cpu_run, tmp_path):
    # A checkpoint whose checksum holds but whose events do not parse: the
    # read from it fails as damage (CorruptCaptureError), never otherwise.
    from allocscope.capture import checkpoints
    from allocscope.capture.reader import CorruptCaptureError

    with open(cpu_run, "rb") as f:
        data = bytearray(f.read())
    c = checkpoints.find(memoryview(bytes(data)))[-1]
    start = c.offset + F.CHUNK_HEADER.size
    payload = bytes(data[start:start + c.length])
    n, pos = F.read_varint(payload, 0)
    forged = payload[:pos + n] + F.varint(10**6) + payload[pos + n + 1:]  # an events block longer than the chunk
    data[c.offset:start + c.length] = F.chunk(F.Chunk.CHECKPOINT, forged)
    path = str(tmp_path / "forged.alsc")
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(CorruptCaptureError, match="invalid"):
        allocscope.load(path, from_step=c.iteration + 1)
    assert main(["report", path, "--steps", str(c.iteration + 1)]) != 0


@pytest.mark.cuda
def test_no_read_starts_from_a_checkpoint_taken_after_private_pools_were_used(tmp_path):
    # Which private pool serves which allocation is not in a checkpoint:
    # reads start from one taken before any was used, or from the start.
    path = str(tmp_path / "pools.alsc")
    torch.manual_seed(0)
    model = Model().cuda()
    opt = torch.optim.AdamW(model.parameters())
    pool = torch.cuda.MemPool()
    with allocscope.record(path, device="cuda", checkpoint_every=400) as rec:
        rec.watch(model, opt)
        for step in range(10):
            if step == 4:
                with torch.cuda.use_mem_pool(pool):
                    kept = torch.ones(1 << 20, device="cuda")  # live from here on
            model(torch.randint(0, 40, (4, 16), device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad()
    del kept, pool  # (its segments go when the test ends: no_cached_segments_left)
    with open(path, "rb") as f:
        data = memoryview(f.read())
    from allocscope.capture import checkpoints

    flags = [c.header["private_pools"] for c in checkpoints.find(data)]
    assert False in flags and True in flags
    whole = allocscope.load(path)
    for first in range(1, 9):
        part = allocscope.load(path, from_step=first)
        assert part.resumed is None or not part.resumed["private_pools"]
        assert comparable(build_report(part, steps=(first, first))) == \
            comparable(build_report(whole, steps=(first, first))), first


@pytest.mark.cuda
def test_a_mark_inside_a_cuda_graph_capture_takes_no_checkpoint(tmp_path):
    # A checkpoint queries the device: inside a capture it would break it.
    from allocscope.capture import checkpoints

    path = str(tmp_path / "graph.alsc")
    x = torch.ones(1 << 16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with allocscope.record(path, device="cuda", checkpoint_every=1):
        allocscope.mark("before")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x * 2  # warm up on a side stream, as torch.cuda.graph asks
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):  # (a device query inside would end the capture with an error)
            x * 2
            allocscope.mark("inside")
        graph.replay()
        allocscope.mark("after")
    with open(path, "rb") as f:
        marks = [c.header["marks"] for c in checkpoints.find(memoryview(f.read()))]
    assert marks == [[], ["before", "inside"]]
